"""A chunk's content digest and the window of the digests of a sequence's newest applied chunks.

With them a resent chunk is compared with the one applied (a `conflicting_duplicate` when they
differ), in the stateful stage and in the one-line API alike; the window travels in every
checkpoint commit, so a later job (or call) checks what an earlier one applied.  No Beam here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from linstream.state import DIGEST_BYTES, MAX_DIGESTS

__all__ = ["DigestWindow", "chunk_digest"]


class DigestWindow:
    """Content digests of the newest applied chunks (at most MAX_DIGESTS), for chunks
    ``next_chunk - len .. next_chunk - 1``: a resent chunk is compared with what was applied."""

    __slots__ = ("data",)

    def __init__(self, raw: bytes | None) -> None:
        self.data = bytes(raw or b"")

    def __len__(self) -> int:
        return len(self.data) // DIGEST_BYTES

    def push(self, digest: bytes) -> None:
        if len(digest) != DIGEST_BYTES:
            msg = f"a chunk digest has {DIGEST_BYTES} bytes, got {len(digest)}"
            raise ValueError(msg)
        self.data = (self.data + digest)[-MAX_DIGESTS * DIGEST_BYTES :]

    def get(self, index: int, next_chunk: int) -> bytes | None:
        """The digest of applied chunk ``index``, or None when it is outside the window."""
        k = index - (next_chunk - len(self))
        if not 0 <= k < len(self):
            return None
        return self.data[k * DIGEST_BYTES : (k + 1) * DIGEST_BYTES]


def chunk_digest(data: Any, final: bool) -> bytes:
    """BLAKE2b of a validated payload (arrays or a mapping of arrays) and its final flag."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(b"F" if final else b"-")
    _feed(h, data)
    return h.digest()


def _feed(h: Any, data: Any) -> None:
    if isinstance(data, Mapping):
        for key in sorted(data):
            h.update(f"k{key}\x00".encode())
            _feed(h, data[key])
        return
    arr = np.ascontiguousarray(data)
    if arr.dtype.kind in "iu":  # token ids: the same ids are the same chunk, whatever the width
        arr = arr.astype("<i8")
    h.update(f"a{arr.dtype.str}{list(arr.shape)}\x00".encode())
    h.update(arr.data)
