"""One sequence's life in the stateful stage, as a plain class over a small interface to its state.

`SequenceStage` takes a key's chunk and decides everything about it: it validates the chunk,
restores the sequence from the checkpoint store when it returns (or on resume), drops it (a
duplicate: checked against its digest), dead-letters it (after the final chunk, beyond the
buffer bound, a conflicting resend), buffers it (early: its predecessors have not all arrived) or
applies it, and then every buffered chunk right behind it, in batches bounded in bytes.  A
commit is made every ``checkpoint_every`` chunks and at the final chunk (with the output span it
finalizes when ``output_dir`` is set).  When a sequence goes idle it dead-letters the chunks
still waiting behind a gap, commits what is uncommitted and clears the key's state; the sequence
is restored from the store when it returns.  A sequence that has no commit starts from the
state file the job names for it (`--initial-state`: initial_states.py), else the zero state.

It yields plain values, `ChunkResult`s and `DeadLetter`s, reads and writes the key's state
through `StateCells` (cells.py: one packed cell and two bags) and sets the idle timer through
`IdleTimer` (event times in microseconds).  Beam's state objects satisfy `StateCells` and the
Beam adapter, `SequenceDoFn` (dofn.py), hands it Beam's timer; the one-line API
(`linstream.pipeline.embed`) and the tests drive this class with in-memory cells, without a
runner.  Counters come from an injected `MetricSource` (in memory unless one is given: the
transforms give Beam's metrics).  No Beam here: the stage runs where Beam is not imported.

(About 400 lines: every decision about a chunk is in this one class, in the order it is made.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
from linstream.pipeline.values import Chunk, ChunkResult, DeadLetter
from linstream.state import CheckpointError, CheckpointStore, SequenceState, unpack_state
from linstream.state.exchange import StateFileError

from .applier import Applied, Applier, Working, as_state, is_int
from .cells import Cells, Ready, StateCells
from .commits import Commits
from .config import StageConfig
from .counters import Counters, MetricSource
from .initial_states import InitialStates
from .progress import Progress
from .records import END_OF_TIME_US, NO_TIMER_US, DigestWindow, Meta, chunk_digest
from .spans import SpanWriter
from .steps import BadInput, ChunkStep

__all__ = ["IdleTimer", "Output", "SequenceStage"]

#: What the stage yields: a chunk's result, or a dead letter.
Output = ChunkResult | DeadLetter

_log = logging.getLogger(__name__)

#: Commits whose folders' fsyncs are made together (``CheckpointStore.sync_batch``): at the
#: latest when this many wait, and at every bundle's end, before its outputs are published.
SYNC_BATCH = 64


class IdleTimer(Protocol):
    """The key's idle timer: an event-time timer, set in microseconds (the Beam adapter sets
    Beam's timer object; the one-line API and the tests keep it in memory)."""

    def set(self, event_time_us: int) -> None: ...


class SequenceStage:
    """The per-sequence logic of the stateful stage (see the module docstring).

    ``setup()`` before the first chunk (loads the step, opens the store), ``start_bundle()``
    and ``finish_bundle()`` around each bundle (every span committed in it is published at its
    end), ``teardown()`` at the end.
    """

    def __init__(
        self, step: ChunkStep, config: StageConfig, *, metrics: MetricSource | None = None
    ) -> None:
        self.step = step
        self.config = config
        self._metrics = metrics
        self._m: Counters | None = None
        self._applier: Applier | None = None
        self._store: CheckpointStore | None = None
        self._commits: Commits | None = None
        self._chunks_logged = 0
        self._initial = InitialStates(config.initial_state)
        self._said_ignored = False

    # -- lifecycle --------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.config
        self.step.setup()
        if cfg.checkpoint_dir:
            self._store = CheckpointStore(
                cfg.checkpoint_dir,
                keep=cfg.checkpoint_keep,
                sync_batch=SYNC_BATCH,
            )
            # None: the store's recorded N; a new N is recorded (said once, by whoever gave it).
            note = self._store.settle_keep_every(cfg.keep_every_tokens)
            if note and cfg.keep_every_tokens is not None:
                _log.info("%s", note)
            spans = None
            if cfg.output_dir:
                spans = SpanWriter(
                    cfg.output_dir,
                    per_token=cfg.emit == "tokens",
                    compute_dtype=getattr(self.step, "compute_dtype", None),
                )
            self._commits = Commits(
                self._store,
                spans,
                self.step,
                self.m,
                emit=cfg.emit,
                restore_fallback=cfg.restore_fallback,
            )

    def start_bundle(self) -> None:
        if self._commits is not None:
            self._commits.start_bundle()

    def finish_bundle(self) -> None:
        if self._commits is not None:
            self._commits.flush()  # every span this bundle committed is published
        progress = None if self._applier is None else self._applier.progress
        if progress is not None and progress.chunks > self._chunks_logged:
            self._chunks_logged = progress.chunks  # `linstream -v`: where the stage stands
            _log.info("%s", progress.line().removeprefix("linstream: "))

    def teardown(self) -> None:
        try:
            if self._commits is not None:
                self._commits.close()
        finally:
            if self._store is not None:
                self._store.close()

    @property
    def m(self) -> Counters:
        if self._m is None:
            self._m = Counters(self._metrics)
        return self._m

    @property
    def applier(self) -> Applier:
        if self._applier is None:  # on first use: the progress line's clock starts here
            cfg = self.config
            self._applier = Applier(
                self.step,
                self.m,
                Progress(cfg.progress_every_s, cfg.total_tokens),
                emit=cfg.emit,
                max_chunk_tokens=cfg.max_chunk_tokens,
                block_tokens=cfg.block_tokens,
            )
        return self._applier

    # -- a chunk ----------------------------------------------------------------------------
    def process(
        self,
        seq_id: str,
        chunk: Chunk,
        cells: StateCells,
        *,
        event_time_us: int,
        timer: IdleTimer,
    ) -> Iterator[Output]:
        """Everything one chunk of sequence ``seq_id`` causes; ``event_time_us`` is its event
        time in microseconds (as Beam's timestamps count them)."""
        idx = chunk.index
        # 1. What can be judged from the chunk alone.
        if not is_int(idx):
            yield self._dead(seq_id, idx, "bad_index", "expected an integer chunk index")
            return
        idx = int(idx)
        if idx < 0:
            yield self._dead(seq_id, idx, "bad_index", "expected a chunk index >= 0")
            return
        try:
            data = self.step.validate(chunk.data)
        except BadInput as bad:
            yield self._dead(seq_id, idx, bad.reason, bad.message)
            return
        digest = chunk_digest(data, chunk.final)

        # 2. Where the sequence stands.
        view = Cells(cells)
        meta = view.meta
        if meta.fenced:
            yield self._fenced(seq_id, idx)
            return
        try:
            st = self._current_state(seq_id, data, meta, view)
        except CheckpointError as ex:
            yield self._dead(seq_id, idx, "restore_failed", self.step.restore_message(ex))
            return
        except StateFileError as ex:  # checked before the job: changed since, or another shape
            yield self._dead(seq_id, idx, "initial_state", str(ex))
            return
        except (ValueError, TypeError) as ex:  # the payload has no valid state shape
            yield self._dead(seq_id, idx, "bad_shape", f"{type(ex).__name__}: {ex}")
            return
        meta.seen, meta.evicted = True, False
        # 3. Drop, dead-letter, buffer or apply it.
        yield from self._order(seq_id, idx, chunk.final, data, digest, st, meta, view)
        self._set_timer(timer, meta, event_time_us)
        view.flush()

    def _current_state(
        self, seq_id: str, data: Any, meta: Meta, view: Cells
    ) -> SequenceState | None:
        """The sequence's state: the working copy, else (returning or resumed) the store's, else
        (never committed) the state it starts from: its initial state file's, or None (the
        step's zero state)."""
        raw = view.state_raw
        if raw is not None:
            return unpack_state(raw, expected_fingerprint=self.step.fingerprint)
        if self._commits is not None and (meta.evicted or (self.config.resume and not meta.seen)):
            st = self._commits.restore(seq_id, data, meta, view)
            if st is not None:
                view.set_state(st)  # restore once per return of the sequence
                self._note_ignored(seq_id, st)
                return st
            if meta.evicted:
                return None
        if meta.committed_next > 0 or not self._initial:
            return None  # committed by this job: restored above, or held as its working copy
        return self._initial.for_sequence(seq_id, self.step.initial_state(seq_id, data))

    def _note_ignored(self, seq_id: str, st: SequenceState) -> None:
        """Say once that sequences with a commit resume from it, not from their state file."""
        path = self._initial.path_for(seq_id)
        if path is None or self._said_ignored:
            return
        self._said_ignored = True
        _log.warning(
            "sequence %r resumes from its commit at position %d; its --initial-state %s is "
            "not used (nor for any other sequence that has a commit)",
            seq_id,
            st.position,
            path,
        )

    # -- idle -------------------------------------------------------------------------------
    def on_idle(self, seq_id: str, cells: StateCells) -> Iterator[Output]:
        """The idle timer fired: commit, report the chunks stuck in the buffer (behind a gap,
        or `fenced` when another job has the sequence), and clear the key's state."""
        view = Cells(cells)
        meta = view.meta
        raw = view.state_raw
        st = None if raw is None else unpack_state(raw, expected_fingerprint=self.step.fingerprint)
        next_chunk = 0 if st is None else st.next_chunk
        committed = st is not None and self._commits is not None and not meta.fenced
        if committed:
            assert st is not None
            _st, refused = self._commit(seq_id, st, meta, view)
            yield from refused
        if meta.fenced:
            yield from self._fenced_buffer(seq_id, view)
        elif len(view.index):
            for i in view.index.rows["index"]:
                yield self._dead(
                    seq_id,
                    int(i),
                    "gap",
                    f"waited for chunk {next_chunk}, which did not arrive before the sequence "
                    f"went idle; resend chunks from {next_chunk} on to continue it",
                )
            view.clear_chunks()
        if committed:
            self._evict(meta, view)
            meta.evicted = not meta.fenced
        meta.timer_micros = NO_TIMER_US  # fired: the next element sets it again
        view.flush()

    def _set_timer(self, timer: IdleTimer, meta: Meta, ts: int) -> None:
        idle = int(self.config.idle_timeout * 1_000_000)  # as Beam's Duration.of counts it
        target = min(ts + idle, END_OF_TIME_US) if ts < END_OF_TIME_US else END_OF_TIME_US
        if target > meta.timer_micros:
            # Only when the target moves: a batch job's elements all carry one timestamp, and
            # setting the same timer again per element costs the runner per element.
            meta.timer_micros = target
            timer.set(target)

    def _evict(self, meta: Meta, view: Cells) -> None:
        """Clear the Beam state of a committed sequence (restored from the store if it returns)."""
        view.set_state(None)
        view.window = DigestWindow(None)
        view.clear_outputs()
        view.outsum = None
        meta.evicted = True
        self.m.evictions.inc()

    # -- dead letters and commits -----------------------------------------------------------
    def _fenced(self, seq_id: str, index: Any) -> DeadLetter:
        return self._dead(
            seq_id, index, "fenced", "another job advanced this sequence; this job stopped it"
        )

    def _fenced_buffer(self, seq_id: str, view: Cells) -> Iterator[DeadLetter]:
        """The chunks still waiting in a fenced sequence's buffer: another job has the
        sequence, so they are `fenced` (not a gap), and the buffer is emptied."""
        for i in view.index.rows["index"]:
            yield self._fenced(seq_id, int(i))
        view.clear_chunks()

    def _dead(self, seq_id: str, index: Any, reason: str, message: str) -> DeadLetter:
        self.m.dead(reason)
        idx = int(index) if is_int(index) else None
        if idx is None:
            message = f"{message} (chunk index {index!r})"
        text = f"sequence {seq_id!r}, chunk {index!r}: {message}"
        return DeadLetter(seq_id, idx, reason, text)

    def _after_final(self, seq_id: str, idx: int, final_index: int) -> DeadLetter:
        return self._dead(
            seq_id, idx, "after_final", f"expected no chunk after the final chunk {final_index}"
        )

    def _commit(
        self, seq_id: str, st: SequenceState, meta: Meta, view: Cells
    ) -> tuple[SequenceState, list[DeadLetter]]:
        """Commit ``st`` (and its output span): the state to go on from, and the dead letters of
        the chunks it covered when another job advanced the sequence first."""
        if self._commits is None:
            return st, []
        first = max(meta.committed_next, 0)
        st, refused = self._commits.commit(seq_id, st, meta, view)
        if refused is None:
            return st, []
        return st, [
            self._dead(
                seq_id,
                i,
                "fenced",
                f"{refused}; this job's output for the chunk is not kept. Resume with "
                "--resume after the other job ends, or use a fresh checkpoint folder",
            )
            for i in range(first, st.next_chunk)
        ]

    # -- ordering ---------------------------------------------------------------------------
    def _order(
        self,
        seq_id: str,
        idx: int,
        final: bool,
        data: Any,
        digest: bytes,
        st: SequenceState | None,
        meta: Meta,
        view: Cells,
    ) -> Iterator[Output]:
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
            applied = view.window.get(idx, next_chunk)
            committed = idx < meta.committed_next  # in a commit: this job's or an earlier one's
            yield from self._duplicate(seq_id, idx, digest, applied, committed=committed)
            return
        index = view.index
        if idx > next_chunk:
            # Early: buffer it until its predecessors arrive (bounded only if asked).
            seen = index.find(idx)
            if seen is not None:
                yield from self._duplicate(seq_id, idx, digest, seen)
                return
            bound = self.config.max_buffered_chunks
            if bound is not None and idx - next_chunk > bound:
                yield self._dead(
                    seq_id,
                    idx,
                    "beyond_buffer",
                    f"expected a chunk index below {next_chunk + bound + 1} "
                    f"(next to apply is {next_chunk}, at most {bound} "
                    "chunks are buffered ahead of it)",
                )
                return
            view.hold_chunk(Chunk(seq_id, idx, data, final))
            if not len(index):
                self.m.gaps.inc()  # a gap opened: chunk `next_chunk` is missing for now
            index.add(idx, digest)
            meta.n_buffered = len(index)
            self.m.buffered.inc()
            if final:
                meta.final_index = idx
                for late in index.above(idx):
                    yield self._after_final(seq_id, int(late), idx)
                view.keep_chunks_through(idx)
            return
        # In order: apply it, then whatever the buffer holds right behind it.
        yield from self._apply_run(seq_id, [(idx, data, final, digest)], st, meta, view)

    def _duplicate(
        self,
        seq_id: str,
        idx: int,
        digest: bytes,
        applied: bytes | None,
        *,
        committed: bool = False,
    ) -> Iterator[Output]:
        if applied is None:
            self.m.duplicates_unchecked.inc()  # older than the digest window
        elif applied != digest:
            if committed:  # e.g. an input file edited between a job and its --resume
                message = (
                    f"the input for sequence {seq_id!r} changed since its checkpoint (chunk {idx} "
                    "differs from the one applied: other content or another final flag); the "
                    "applied chunk is kept. Resume with the input it was made from, or start "
                    "the sequence again in an empty checkpoint folder"
                )
            else:
                message = (
                    "a chunk with this index and other content (or another final flag) was "
                    "already accepted; the first one is kept"
                )
            yield self._dead(seq_id, idx, "conflicting_duplicate", message)
            return
        self.m.duplicates.inc()

    def _apply_run(
        self,
        seq_id: str,
        ready: list[Ready],
        st: SequenceState | Working | None,
        meta: Meta,
        view: Cells,
    ) -> Iterator[Output]:
        """Apply ``ready`` and every buffered chunk behind it, in bounded batches."""
        changed = False
        index = view.index
        while ready:
            for cidx, cdata, cfinal, cdigest in ready:
                done = self.applier.apply(seq_id, cidx, cdata, st)
                if not isinstance(done, Applied):  # refused: the sequence keeps its state
                    yield self._dead(seq_id, cidx, done.reason, done.message)
                    ready = []
                    break
                st, changed = done.state, True
                result = self._emitted(done.result, st, cfinal, view)
                if result is not None:
                    if self.config.output_dir:
                        view.hold_output(result)
                    yield result
                view.window.push(cdigest)
                if cfinal:
                    meta.final_index = cidx
                due = st.next_chunk - max(meta.committed_next, 0) >= self.config.checkpoint_every
                if due or cfinal:
                    st, refused = self._commit(seq_id, as_state(st), meta, view)
                    yield from refused
                    if meta.fenced:  # what waits in the buffer will not be applied either
                        yield from self._fenced_buffer(seq_id, view)
                        ready = []
                        break
                if cfinal:  # nothing after the final chunk is applied
                    for late in index.above(cidx):
                        yield self._after_final(seq_id, int(late), cidx)
                    view.clear_chunks()
                    ready = []
                    break
            else:
                ready = view.take_run(st.next_chunk) if st is not None and len(index) else []
        if meta.n_buffered:
            view.drop_chunks_below(0 if st is None else st.next_chunk)
            meta.n_buffered = len(index)
        if changed and st is not None:
            view.set_state(st)

    def _emitted(
        self, result: ChunkResult, st: SequenceState | Working, final: bool, view: Cells
    ) -> ChunkResult | None:
        """The chunk's result, or with emit="sequence" the running sum (and at the final chunk
        the sequence's mean over all its tokens, as its one result)."""
        if self.config.emit != "sequence":
            return result
        raw = view.outsum
        total = (
            result.output
            if raw is None
            else np.frombuffer(raw, "<f8").reshape(result.output.shape) + result.output
        )
        view.outsum = np.ascontiguousarray(total, "<f8").tobytes()
        if not final:
            return None
        return _mean(st.seq_id, result.index, total, st.position)

    def finished_output(self, seq_id: str, cells: StateCells) -> ChunkResult | None:
        """With emit="sequence", the result of a sequence that its checkpoint holds finished
        (restored when one of its chunks arrived, every chunk a duplicate): its mean, from
        the running sum the commit carries.  None for any other sequence (the one-line API
        returns every finished sequence's vector; a job emits it once, when it finishes)."""
        view = Cells(cells)
        meta, raw = view.meta, view.state_raw
        if self.config.emit != "sequence" or meta.final_index < 0 or raw is None or not view.outsum:
            return None
        st = unpack_state(raw, expected_fingerprint=self.step.fingerprint)
        if st.next_chunk <= meta.final_index:
            return None
        return _mean(seq_id, meta.final_index, np.frombuffer(view.outsum, "<f8"), st.position)


def _mean(seq_id: str, index: int, total: np.ndarray, position: int) -> ChunkResult:
    """emit="sequence": a finished sequence's one result, the mean over all its tokens."""
    return ChunkResult(seq_id, index, 0, (total / position).astype(np.float32))
