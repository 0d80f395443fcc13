"""Ordering and applying one sequence's chunks inside the stateful stage (core.py).

A valid chunk is dropped (a duplicate of an applied or buffered one: checked against its digest),
dead-lettered (after the final chunk, beyond the buffer bound), buffered (early: its predecessors
have not all arrived) or applied, and then every buffered chunk right behind it is applied too,
in batches bounded in bytes.  A commit is made every ``checkpoint_every`` chunks and at the final
chunk.  `OrderedApply` is mixed into `SequenceDoFn`, which supplies the counters, the applier,
the dead-letter and commit helpers and the settings read here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from linstream.pipeline.elements import Chunk, ChunkResult
from linstream.state import SequenceState

from .applier import Applied, Applier, Counters
from .cells import Cells
from .records import BufferIndex, Meta

__all__ = ["DRAIN_BYTES", "OrderedApply"]

#: Chunks read from the bag into memory at once while draining (payload bytes bound it too).
DRAIN_BYTES = 64 << 20


class OrderedApply:
    """The ordering half of `SequenceDoFn` (see the module docstring)."""

    max_buffered_chunks: int | None
    checkpoint_every: int
    output_dir: str | None
    emit: str

    @property
    def m(self) -> Counters:  # supplied by SequenceDoFn
        raise NotImplementedError

    @property
    def applier(self) -> Applier:  # supplied by SequenceDoFn
        raise NotImplementedError

    def _dead(self, seq_id: str, index: Any, reason: str, message: str) -> beam.pvalue.TaggedOutput:
        raise NotImplementedError  # supplied by SequenceDoFn

    def _commit(
        self, seq_id: str, st: SequenceState, meta: Meta, cells: Cells
    ) -> Iterator[beam.pvalue.TaggedOutput | SequenceState]:
        raise NotImplementedError  # supplied by SequenceDoFn

    def _order(
        self,
        seq_id: str,
        idx: int,
        final: bool,
        data: Any,
        digest: bytes,
        st: SequenceState | None,
        meta: Meta,
        cells: Cells,
    ) -> Iterator[Any]:
        """Drop, buffer or apply one valid chunk."""
        next_chunk = 0 if st is None else st.next_chunk
        if meta.final_index >= 0 and idx > meta.final_index:
            yield self._after_final(seq_id, idx, meta.final_index)
            return
        if final and meta.final_index >= 0 and idx != meta.final_index:
            yield self._dead(
                seq_id,
                idx,
                "after_final",
                f"chunk {idx} is marked final, but chunk {meta.final_index} already was",
            )
            return
        if idx < next_chunk:
            yield from self._duplicate(seq_id, idx, digest, cells.window.get(idx, next_chunk))
            return
        index = cells.index
        if idx > next_chunk:
            # Early: buffer it until its predecessors arrive (bounded only if asked).
            seen = index.find(idx)
            if seen is not None:
                yield from self._duplicate(seq_id, idx, digest, seen)
                return
            if self.max_buffered_chunks is not None and idx - next_chunk > self.max_buffered_chunks:
                yield self._dead(
                    seq_id,
                    idx,
                    "beyond_buffer",
                    f"expected a chunk index below {next_chunk + self.max_buffered_chunks + 1} "
                    f"(next to apply is {next_chunk}, at most {self.max_buffered_chunks} "
                    "chunks are buffered ahead of it)",
                )
                return
            cells.hold_chunk(Chunk(seq_id, idx, data, final))
            if not len(index):
                self.m.gaps.inc()  # a gap opened: chunk `next_chunk` is missing for now
            index.add(idx, digest)
            meta.n_buffered = len(index)
            self.m.buffered.inc()
            if final:
                meta.final_index = idx
                for late in index.above(idx):
                    yield self._after_final(seq_id, int(late), idx)
                cells.keep_chunks_through(idx)
            return
        # In order: apply it, then whatever the buffer holds right behind it.
        yield from self._apply_run(seq_id, [(idx, data, final, digest)], st, meta, cells)

    def _duplicate(
        self, seq_id: str, idx: int, digest: bytes, applied: bytes | None
    ) -> Iterator[Any]:
        if applied is None:
            self.m.duplicates_unchecked.inc()  # older than the digest window
        elif applied != digest:
            yield self._dead(
                seq_id,
                idx,
                "conflicting_duplicate",
                "a chunk with this index and other content (or another final flag) was "
                "already accepted; the first one is kept",
            )
            return
        self.m.duplicates.inc()

    def _apply_run(
        self,
        seq_id: str,
        ready: list[tuple[int, Any, bool, bytes]],
        st: SequenceState | None,
        meta: Meta,
        cells: Cells,
    ) -> Iterator[Any]:
        """Apply ``ready`` and every buffered chunk behind it, in bounded batches."""
        changed = False
        index = cells.index
        while ready:
            for cidx, cdata, cfinal, cdigest in ready:
                done = self.applier.apply(seq_id, cidx, cdata, st)
                if not isinstance(done, Applied):  # refused: the sequence keeps its state
                    yield self._dead(seq_id, cidx, done.reason, done.message)
                    ready = []
                    break
                st, changed = done.state, True
                result = self._emitted(done.result, st, cfinal, cells)
                if result is not None:
                    if self.output_dir:
                        cells.hold_output(result)
                    yield result
                cells.window.push(cdigest)
                if cfinal:
                    meta.final_index = cidx
                due = st.next_chunk - max(meta.committed_next, 0) >= self.checkpoint_every
                if due or cfinal:
                    for item in self._commit(seq_id, st, meta, cells):
                        if isinstance(item, SequenceState):
                            st = item
                        else:
                            yield item
                    if meta.fenced:
                        ready = []
                        break
                if cfinal:  # nothing after the final chunk is applied
                    for late in index.above(cidx):
                        yield self._after_final(seq_id, int(late), cidx)
                    cells.clear_chunks()
                    ready = []
                    break
            else:
                ready = self._next_batch(st, index, cells) if st is not None and len(index) else []
        if meta.n_buffered:
            cells.drop_chunks_below(0 if st is None else st.next_chunk)
            meta.n_buffered = len(index)
        if changed and st is not None:
            cells.set_state(st)

    def _emitted(
        self, result: ChunkResult, st: SequenceState, final: bool, cells: Cells
    ) -> ChunkResult | None:
        """The chunk's result, or with emit="sequence" the running sum (and at the final chunk
        the sequence's mean over all its tokens, as its one result)."""
        if self.emit != "sequence":
            return result
        raw = cells.outsum
        total = (
            result.output
            if raw is None
            else np.frombuffer(raw, "<f8").reshape(result.output.shape) + result.output
        )
        cells.outsum = np.ascontiguousarray(total, "<f8").tobytes()
        if not final:
            return None
        return ChunkResult(st.seq_id, result.index, 0, (total / st.position).astype(np.float32))

    def _next_batch(
        self, st: SequenceState, index: BufferIndex, cells: Cells
    ) -> list[tuple[int, Any, bool, bytes]]:
        """The buffered chunks right behind ``st`` (bounded in bytes when read from the bag)."""
        run = index.run_from(st.next_chunk)
        if not run:
            return []
        want = range(st.next_chunk, st.next_chunk + run)
        got = cells.held_chunks(want, DRAIN_BYTES)
        batch = []
        for i in want:
            c = got.get(i)
            if c is None:
                break
            digest = index.find(i)
            assert digest is not None  # the run was read from the index
            batch.append((i, c.data, c.final, digest))
        cells.drop_chunks_below(st.next_chunk + len(batch))
        return batch

    def _after_final(self, seq_id: str, idx: int, final_index: int) -> Any:
        return self._dead(
            seq_id, idx, "after_final", f"expected no chunk after the final chunk {final_index}"
        )
