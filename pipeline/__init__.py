"""linstream.pipeline: Beam transforms, the stateful DoFn, I/O and the `linstream` command, and
the one-line API (`embed`, `Resumable`).

Names are imported on first use, so that `linstream --help`, `linstream checkpoint ...` and
`from linstream.pipeline import embed` start without importing Beam.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from linstream.pipeline.app.embed_api import DeadLetterError, Resumable, embed
    from linstream.pipeline.io.text_input import InputConfig, ToChunks, read_input
    from linstream.pipeline.stage.transforms import CausalLinearAttention, EmbedSequences

    from .elements import (
        Chunk,
        ChunkCoder,
        ChunkResult,
        ChunkResultCoder,
        DeadLetter,
        DeadLetterCoder,
    )

__all__ = [
    "CausalLinearAttention",
    "Chunk",
    "ChunkCoder",
    "ChunkResult",
    "ChunkResultCoder",
    "DeadLetter",
    "DeadLetterCoder",
    "DeadLetterError",
    "EmbedSequences",
    "InputConfig",
    "Resumable",
    "ToChunks",
    "embed",
    "read_input",
]

_WHERE = {
    "CausalLinearAttention": ".stage.transforms",
    "EmbedSequences": ".stage.transforms",
    "InputConfig": ".io.text_input",
    "DeadLetterError": ".app.embed_api",
    "Resumable": ".app.embed_api",
    "embed": ".app.embed_api",
    "ToChunks": ".io.text_input",
    "read_input": ".io.text_input",
    **dict.fromkeys(
        ["Chunk", "ChunkCoder", "ChunkResult", "ChunkResultCoder", "DeadLetter", "DeadLetterCoder"],
        ".elements",
    ),
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
