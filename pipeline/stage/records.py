"""Small values the stateful stage keeps beside a sequence's state: the per-key meta record, the
index of buffered chunks, and (from digests.py) the window of applied chunks' digests and a
chunk's content digest.

Each is packed into bytes for a Beam read-modify-write state cell, so that ordering decisions
never read the bag of buffered chunks: only a drain (the next chunk to apply arrived, and the
index says chunks right behind it are buffered) reads it.
"""

from __future__ import annotations

import struct

import numpy as np
from linstream.state import DIGEST_BYTES

from .digests import DigestWindow, chunk_digest

__all__ = ["END_OF_TIME_US", "NO_TIMER_US", "BufferIndex", "DigestWindow", "Meta", "chunk_digest"]

#: Event times in microseconds, as Beam's timestamps count them: its smallest (MIN_TIMESTAMP, the
#: event time of a batch job's elements, and "no timer set") and its largest (MAX_TIMESTAMP, the
#: end of a bounded input), without importing Beam.
NO_TIMER_US = -9223372036854775000
END_OF_TIME_US = 9223372036854775000

# final_index, committed_next, n_buffered, flags, timer target (micros), commit number,
# position of the last commit
_META = struct.Struct("<qqqBqqq")
_EVICTED, _SEEN, _FENCED, _OUTPUTS_IN_BAG, _CHUNKS_IN_BAG = 1, 2, 4, 8, 16


class Meta:
    """Per-sequence bookkeeping (one small state cell)."""

    __slots__ = (
        "chunks_in_bag",
        "commit_no",
        "committed_next",
        "committed_position",
        "evicted",
        "fenced",
        "final_index",
        "n_buffered",
        "outputs_in_bag",
        "seen",
        "timer_micros",
    )

    def __init__(self, raw: bytes | None) -> None:
        if raw:
            fi, cn, nb, fl, tm, no, cp = _META.unpack(raw)
        else:
            fi, cn, nb, fl, tm, no, cp = -1, -1, 0, 0, NO_TIMER_US, 0, 0
        self.final_index, self.committed_next, self.n_buffered = fi, cn, nb
        self.evicted, self.seen, self.fenced = (
            bool(fl & _EVICTED),
            bool(fl & _SEEN),
            bool(fl & _FENCED),
        )
        # Whether the `outbuf` / `buffer` bags hold anything (else they are never read).
        self.outputs_in_bag = bool(fl & _OUTPUTS_IN_BAG)
        self.chunks_in_bag = bool(fl & _CHUNKS_IN_BAG)
        self.timer_micros, self.commit_no, self.committed_position = tm, no, cp

    def pack(self) -> bytes:
        flags = (
            (_EVICTED if self.evicted else 0)
            | (_SEEN if self.seen else 0)
            | (_FENCED if self.fenced else 0)
            | (_OUTPUTS_IN_BAG if self.outputs_in_bag else 0)
            | (_CHUNKS_IN_BAG if self.chunks_in_bag else 0)
        )
        return _META.pack(
            self.final_index,
            self.committed_next,
            self.n_buffered,
            flags,
            self.timer_micros,
            self.commit_no,
            self.committed_position,
        )


# The digest as raw bytes (a fixed-width "S" field would drop trailing NUL bytes).
_ROW = np.dtype([("index", "<i8"), ("digest", "u1", (DIGEST_BYTES,))])


class BufferIndex:
    """The chunk numbers (and content digests) of the chunks waiting in the bag, sorted."""

    __slots__ = ("rows",)

    def __init__(self, raw: bytes | None) -> None:
        self.rows = np.frombuffer(raw, _ROW).copy() if raw else np.zeros(0, _ROW)

    def pack(self) -> bytes:
        return self.rows.tobytes()

    def __len__(self) -> int:
        return len(self.rows)

    def find(self, index: int) -> bytes | None:
        """The digest of buffered chunk ``index``, or None."""
        i = int(np.searchsorted(self.rows["index"], index))
        if i < len(self.rows) and int(self.rows["index"][i]) == index:
            return self.rows["digest"][i].tobytes()
        return None

    def add(self, index: int, digest: bytes) -> None:
        i = int(np.searchsorted(self.rows["index"], index))
        row = np.zeros(1, _ROW)
        row["index"] = index
        row["digest"] = np.frombuffer(digest, np.uint8)
        self.rows = np.insert(self.rows, i, row)

    def run_from(self, start: int) -> int:
        """How many chunks ``start, start + 1, ...`` are buffered without a hole."""
        idx = self.rows["index"]
        i = int(np.searchsorted(idx, start))
        run = idx[i:] - start
        holes = np.nonzero(run != np.arange(len(run)))[0]
        return int(holes[0]) if len(holes) else len(run)

    def drop_below(self, index: int) -> None:
        self.rows = self.rows[self.rows["index"] >= index]

    def above(self, index: int) -> np.ndarray:
        """Buffered chunk numbers above ``index``."""
        return self.rows["index"][self.rows["index"] > index]
