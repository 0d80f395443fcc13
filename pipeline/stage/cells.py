"""A sequence's Beam state, as the stateful stage reads and writes it: one packed cell, two bags.

The runner's state cache (the Python SDK worker's) sizes every value it caches with a deep
object walk whose cost is fixed per call (it first collects every loaded module's globals, a
few milliseconds), and it sizes once per cell a bundle first reads and once or twice per cell
a bundle writes.  So the stage keeps what it touches per element in one cell, `seq`, read and
written once per element, in this layout (little-endian):

    head: six u32 lengths  | meta (records.Meta) | digests (records.DigestWindow) |
    buffer index (records.BufferIndex) | output sum (float64, emit="sequence") |
    held outputs | held chunks | working copy of the state (state/compact.py, to the end)

*Held* outputs are the results since the last commit and held chunks the chunks waiting for
their predecessors, each a list of (chunk index, encoded record), kept in the cell while they
are small (``HOLD_BYTES`` each).  What does not fit goes to the bags (`outbuf`, `buffer`), and a
flag in the meta record says so: a bag is read or cleared only when that flag is set, so a
sequence whose chunks are small never touches them.

The stage reaches the three through `StateCells` (a `ValueCell` and two `Bag`s): Beam's runtime
state objects satisfy that interface, and so do `memory_cells()`, one key's state in memory (the
one-line API runs the stage with them, without a runner), and the stand-ins of the tests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from linstream.pipeline.values import (
    Chunk,
    ChunkResult,
    decode_chunk,
    decode_result,
    encode_chunk,
    encode_result,
)
from linstream.state import SequenceState, pack_state

from .applier import Working
from .records import BufferIndex, DigestWindow, Meta

__all__ = [
    "DRAIN_BYTES",
    "HOLD_BYTES",
    "Bag",
    "Cells",
    "MemoryBag",
    "MemoryCell",
    "Ready",
    "StateCells",
    "ValueCell",
    "memory_cells",
    "pack_records",
    "unpack_records",
]

T = TypeVar("T")


class ValueCell(Protocol):
    """A read-modify-write cell (Beam's `ReadModifyWriteStateSpec` runtime state)."""

    def read(self) -> Any: ...

    def write(self, value: Any) -> None: ...


class Bag(Protocol[T]):
    """A bag of values (Beam's `BagStateSpec` runtime state)."""

    def read(self) -> Iterable[T]: ...

    def add(self, value: T) -> None: ...

    def clear(self) -> None: ...


@dataclass(frozen=True)
class StateCells:
    """One key's state as the stage sees it: Beam's state objects, or in-memory stand-ins."""

    seq: ValueCell
    buffer: Bag[Chunk]
    outbuf: Bag[ChunkResult]


class MemoryCell:
    """A `ValueCell` in memory."""

    def __init__(self) -> None:
        self.value: Any = None

    def read(self) -> Any:
        return self.value

    def write(self, value: Any) -> None:
        self.value = value


class MemoryBag(Generic[T]):
    """A `Bag` in memory."""

    def __init__(self) -> None:
        self.items: list[T] = []

    def read(self) -> list[T]:
        return list(self.items)

    def add(self, value: T) -> None:
        self.items.append(value)

    def clear(self) -> None:
        self.items = []


def memory_cells() -> StateCells:
    """One key's state in memory: what a runner keeps for a key, without a runner."""
    return StateCells(MemoryCell(), MemoryBag(), MemoryBag())


#: Bytes of outputs, and of buffered chunks, kept in the `seq` cell before the bags are used.
HOLD_BYTES = 256 << 10
#: Chunks read from the bag into memory at once while draining (payload bytes bound it too).
DRAIN_BYTES = 64 << 20

#: A chunk ready to apply: (index, validated payload, final flag, content digest).
Ready = tuple[int, Any, bool, bytes]

_HEAD = struct.Struct("<6I")
_REC = struct.Struct("<qI")  # chunk index, bytes of the record


def pack_records(records: Iterable[tuple[int, bytes]]) -> bytes:
    """(index, bytes) records, each behind its index and length."""
    return b"".join(b"".join((_REC.pack(i, len(r)), r)) for i, r in records)


def unpack_records(raw: bytes) -> list[tuple[int, bytes]]:
    out, off = [], 0
    while off < len(raw):
        i, n = _REC.unpack_from(raw, off)
        off += _REC.size
        if off + n > len(raw):
            msg = f"a held record of {n} bytes passes the end of the state cell"
            raise ValueError(msg)
        out.append((i, raw[off : off + n]))
        off += n
    return out


class Cells:
    """One key's state: the `seq` cell decoded once per element and written once (`flush`),
    and the bags for what does not fit in it."""

    def __init__(self, cells: StateCells) -> None:
        self.seq, self.buffer, self.outbuf = cells.seq, cells.buffer, cells.outbuf
        raw = self.seq.read()
        parts: list[bytes] = [b""] * 6
        rest = b""
        if raw:
            sizes = _HEAD.unpack_from(raw)
            off = _HEAD.size
            for k, n in enumerate(sizes):
                parts[k] = raw[off : off + n]
                off += n
            rest = raw[off:]
        self.meta = Meta(parts[0] or None)
        self.window = DigestWindow(parts[1])
        self.index = BufferIndex(parts[2] or None)
        self.outsum: bytes | None = parts[3] or None
        # Kept packed: parsed only at a commit or a drain, not per element.
        self._outputs, self._chunks = parts[4], parts[5]
        self.state_raw: bytes | None = bytes(rest) if rest else None

    def set_state(self, st: SequenceState | Working | None) -> None:
        if st is None:
            self.state_raw = None
        else:
            self.state_raw = st.pack() if isinstance(st, Working) else pack_state(st)

    def flush(self) -> None:
        parts = (
            self.meta.pack(),
            self.window.data,
            self.index.pack() if len(self.index) else b"",
            self.outsum or b"",
            self._outputs,
            self._chunks,
        )
        head = _HEAD.pack(*(len(p) for p in parts))
        self.seq.write(b"".join((head, *parts, self.state_raw or b"")))

    # -- outputs since the last commit --------------------------------------------------------
    def hold_output(self, result: ChunkResult) -> None:
        rec = encode_result(result)
        if not self.meta.outputs_in_bag and len(self._outputs) + len(rec) <= HOLD_BYTES:
            self._outputs += pack_records([(int(result.index), rec)])
        else:
            self.outbuf.add(result)
            self.meta.outputs_in_bag = True

    def held_outputs(self) -> list[ChunkResult]:
        results = [decode_result(r) for _, r in unpack_records(self._outputs)]
        if self.meta.outputs_in_bag:
            results.extend(self.outbuf.read())
        return results

    def clear_outputs(self) -> None:
        self._outputs = b""
        if self.meta.outputs_in_bag:
            self.outbuf.clear()
            self.meta.outputs_in_bag = False

    # -- chunks waiting for their predecessors ------------------------------------------------
    def hold_chunk(self, chunk: Chunk) -> None:
        rec = encode_chunk(chunk)
        if len(self._chunks) + len(rec) <= HOLD_BYTES:
            self._chunks += pack_records([(int(chunk.index), rec)])
        else:
            self.buffer.add(chunk)
            self.meta.chunks_in_bag = True

    def held_chunks(self, want: range, limit: int) -> dict[int, Chunk]:
        """The buffered chunks of ``want``: those held in the cell, then (only if one is missing
        and the bag holds chunks) those read from the bag while under ``limit`` bytes."""
        got = {i: decode_chunk(r) for i, r in unpack_records(self._chunks) if i in want}
        if self.meta.chunks_in_bag and len(got) < len(want):
            held = sum(_nbytes(c.data) for c in got.values())
            for c in self.buffer.read():
                i = int(c.index)
                if i in want and i not in got and (held < limit or i == want.start):
                    got[i] = c
                    held += _nbytes(c.data)
        return got

    def take_run(self, start: int) -> list[Ready]:
        """The buffered chunks ``start, start + 1, ...`` up to the first hole (bounded in bytes
        when read from the bag), taken out of the buffer."""
        run = self.index.run_from(start)
        if not run:
            return []
        want = range(start, start + run)
        got = self.held_chunks(want, DRAIN_BYTES)
        batch = []
        for i in want:
            c = got.get(i)
            if c is None:
                break
            digest = self.index.find(i)
            assert digest is not None  # the run was read from the index
            batch.append((i, c.data, c.final, digest))
        self.drop_chunks_below(start + len(batch))
        return batch

    def drop_chunks_below(self, index: int) -> None:
        """Forget buffered chunks below ``index`` (applied, or refused with the index)."""
        self.index.drop_below(index)
        self._keep_chunks(lambda i: i >= index)
        self.meta.n_buffered = len(self.index)
        if not len(self.index):
            self.clear_chunks()

    def clear_chunks(self) -> None:
        self.index.rows = self.index.rows[:0]
        self._chunks = b""
        if self.meta.chunks_in_bag:
            self.buffer.clear()
            self.meta.chunks_in_bag = False
        self.meta.n_buffered = 0

    def keep_chunks_through(self, index: int) -> None:
        """Forget buffered chunks above ``index`` (the final chunk)."""
        self.index.rows = self.index.rows[self.index.rows["index"] <= index]
        self._keep_chunks(lambda i: i <= index)
        self.meta.n_buffered = len(self.index)

    def _keep_chunks(self, keep: Callable[[int], bool]) -> None:
        if self._chunks:
            self._chunks = pack_records((i, r) for i, r in unpack_records(self._chunks) if keep(i))


def _nbytes(data: Any) -> int:
    if isinstance(data, dict):
        return sum(int(np.asarray(v).nbytes) for v in data.values())
    return int(np.asarray(data).nbytes)
