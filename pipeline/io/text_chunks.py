"""One whole sequence cut into chunks: its token ids (from text, a file's bytes or a list of ids),
every `chunk_tokens` ids a chunk, the last one final; or the dead letter saying why it has none.

`ToChunks` (text_input.py) applies `sequence_chunks` to each element, and the one-line API
(`linstream.pipeline.embed`) to each text and file it is given, so both cut alike.  No Beam here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from linstream.pipeline.values import Chunk, DeadLetter

from .tokenizers import TextTokenizer, TokenizerError

__all__ = ["cut", "sequence_chunks", "token_ids"]


def cut(seq_id: str, tokens: np.ndarray, chunk_tokens: int) -> Iterator[Chunk]:
    """Chunks of `chunk_tokens` tokens (the last may be shorter), 0-based, the last `final`."""
    n = max(1, -(-len(tokens) // chunk_tokens))
    for i in range(n):
        part = np.ascontiguousarray(tokens[i * chunk_tokens : (i + 1) * chunk_tokens])
        yield Chunk(seq_id, i, part, final=i == n - 1)


def token_ids(payload: Any, tokenizer: TextTokenizer) -> np.ndarray:
    """The int32 token ids of a text (str), a file's bytes, or a flat list of ids."""
    if isinstance(payload, str):
        return tokenizer.encode(payload)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return tokenizer.encode_bytes(bytes(payload))
    arr = np.asarray(payload)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        msg = f"expected text or a flat list of integer token ids, got {payload!r:.80}"
        raise ValueError(msg)
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        msg = f"token ids must be in [0, 2**31), got {int(arr.min())}..{int(arr.max())}"
        raise ValueError(msg)
    return arr.astype(np.int32)


def sequence_chunks(
    seq_id: str, payload: Any, tokenizer: TextTokenizer, chunk_tokens: int
) -> list[Chunk] | DeadLetter:
    """The chunks of one whole sequence, or its dead letter: `untokenizable` (the tokenizer
    refused it) or `empty_sequence` (no tokens)."""
    try:
        tokens = token_ids(payload, tokenizer)
    except (ValueError, TypeError, UnicodeDecodeError, TokenizerError) as ex:
        return DeadLetter(seq_id, None, "untokenizable", f"sequence {seq_id!r}: {ex}")
    if len(tokens) == 0:
        return DeadLetter(seq_id, None, "empty_sequence", f"sequence {seq_id!r} has no tokens")
    return list(cut(seq_id, tokens, chunk_tokens))
