"""Beam's coders for the pipeline's values (`Chunk`, `ChunkResult`, `DeadLetter`, in values.py),
registered here, where the values are exported for Beam pipelines.

The coders write the values' fixed little-endian layout (values.py: no pickle), so equal
elements always encode to equal bytes: Beam may use them for keys, state and shuffles on any
runner.  They are registered with Beam on import of this module, which every Beam transform
of linstream imports, so that a `Chunk` never meets a runner without its coder (Beam would
otherwise fall back to pickling it, silently).
"""

from __future__ import annotations

import apache_beam as beam

from .values import (
    Chunk,
    ChunkResult,
    DeadLetter,
    Rejected,
    Unencodable,
    decode_chunk,
    decode_dead_letter,
    decode_result,
    encode_chunk,
    encode_dead_letter,
    encode_result,
)

__all__ = [
    "Chunk",
    "ChunkCoder",
    "ChunkResult",
    "ChunkResultCoder",
    "DeadLetter",
    "DeadLetterCoder",
    "Rejected",
    "Unencodable",
]


class ChunkCoder(beam.coders.Coder):
    """Deterministic binary coder for `Chunk`."""

    def encode(self, value: Chunk) -> bytes:
        return encode_chunk(value)

    def decode(self, encoded: bytes) -> Chunk:
        return decode_chunk(encoded)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self) -> type:
        return Chunk


class ChunkResultCoder(beam.coders.Coder):
    """Deterministic binary coder for `ChunkResult`."""

    def encode(self, value: ChunkResult) -> bytes:
        return encode_result(value)

    def decode(self, encoded: bytes) -> ChunkResult:
        return decode_result(encoded)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self) -> type:
        return ChunkResult


class DeadLetterCoder(beam.coders.Coder):
    """Deterministic binary coder for `DeadLetter`."""

    def encode(self, value: DeadLetter) -> bytes:
        return encode_dead_letter(value)

    def decode(self, encoded: bytes) -> DeadLetter:
        return decode_dead_letter(encoded)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self) -> type:
        return DeadLetter


beam.coders.registry.register_coder(Chunk, ChunkCoder)
beam.coders.registry.register_coder(ChunkResult, ChunkResultCoder)
beam.coders.registry.register_coder(DeadLetter, DeadLetterCoder)
