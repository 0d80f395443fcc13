"""linstream.pipeline: Beam transforms, the stateful DoFn, I/O and the `linstream` command."""

from .elements import Chunk, ChunkCoder, ChunkResult, ChunkResultCoder, DeadLetter, DeadLetterCoder
from .transforms import CausalLinearAttention, EmbedSequences

__all__ = [
    "CausalLinearAttention",
    "Chunk",
    "ChunkCoder",
    "ChunkResult",
    "ChunkResultCoder",
    "DeadLetter",
    "DeadLetterCoder",
    "EmbedSequences",
]
