"""The stateful stage shared by every transform: order chunks, carry the state, checkpoint it.

Per sequence id (the key) Beam holds:
  * `state`  — the SequenceState in its Arrow form (read-modify-write state, explicit bytes coder);
  * `buffer` — chunks that arrived before their predecessors (bag state; bounded);
  * `meta`   — a few integers: final chunk index, chunk index at the last commit, buffered count,
    whether the state was evicted to the store, and the idle timer's target.
Chunk i is applied only after 0..i-1.  Every `checkpoint_every` chunks and at the final chunk the
state is committed to the CheckpointStore.  An event-time timer fires when a sequence has been
idle for `idle_timeout` seconds of event time (at the end of input in a batch job): it commits what
is uncommitted, dead-letters chunks still waiting behind a gap, and clears the Beam state; the
sequence is restored from the store when it returns.
"""

from __future__ import annotations

import logging
import struct
import sys
import time
from collections.abc import Generator, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.coders import BytesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp
from linstream.state import (
    CheckpointError,
    CheckpointStore,
    SequenceState,
    decode_state,
    encode_state,
)

from .elements import Chunk, ChunkCoder, ChunkResult, DeadLetter
from .steps import BadInput, ChunkStep

__all__ = ["DEAD_LETTERS", "EMIT_MODES", "SequenceDoFn"]

DEAD_LETTERS = "dead_letters"
EMIT_MODES = ("tokens", "mean", "last")
NAMESPACE = "linstream"

_log = logging.getLogger(__name__)

# final_index, committed_next, n_buffered, flags (1: evicted, 2: seen), timer target (micros)
_META = struct.Struct("<qqqBq")


class _Meta:
    __slots__ = ("committed_next", "evicted", "final_index", "n_buffered", "seen", "timer_micros")

    def __init__(self, raw: bytes | None) -> None:
        if raw:
            fi, cn, nb, ev, tm = _META.unpack(raw)
        else:
            fi, cn, nb, ev, tm = -1, -1, 0, 0, MIN_TIMESTAMP.micros
        self.final_index, self.committed_next, self.n_buffered = fi, cn, nb
        self.evicted, self.seen, self.timer_micros = bool(ev & 1), bool(ev & 2), tm

    def pack(self) -> bytes:
        return _META.pack(
            self.final_index,
            self.committed_next,
            self.n_buffered,
            (1 if self.evicted else 0) | (2 if self.seen else 0),
            self.timer_micros,
        )


def _all_finite(out: Any, layers: Any) -> bool:
    return bool(np.isfinite(out).all()) and all(
        bool(np.isfinite(a.S).all() and np.isfinite(a.z).all()) for a in layers
    )


class _Counters:
    def __init__(self) -> None:
        c = lambda name: Metrics.counter(NAMESPACE, name)  # noqa: E731
        self.chunks = c("chunks")
        self.tokens = c("tokens")
        self.duplicates = c("duplicates")
        self.buffered = c("buffered")
        self.gaps = c("gaps")
        self.dead_letters = c("dead_letters")
        self.commits = c("commits")
        self.commit_duplicates = c("commit_duplicates")
        self.commit_equal_within_tolerance = c("commit_equal_within_tolerance")
        self.restores = c("restores")
        self.evictions = c("evictions")
        self.kernel_time = Metrics.distribution(NAMESPACE, "kernel_time_us")
        self._by_reason: dict[str, Any] = {}

    def dead(self, reason: str) -> None:
        self.dead_letters.inc()
        if reason not in self._by_reason:
            self._by_reason[reason] = Metrics.counter(NAMESPACE, f"dead_letters.{reason}")
        self._by_reason[reason].inc()


class _Progress:
    """Logs tokens done and tokens/s on this worker every `every_s` seconds."""

    def __init__(self, every_s: float | None) -> None:
        self.every_s = every_s
        self.start = time.monotonic()
        self.last = self.start
        self.tokens = 0
        self.chunks = 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens
        self.chunks += 1
        if self.every_s is None:
            return
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            rate = self.tokens / max(now - self.start, 1e-9)
            print(
                f"linstream: {self.tokens:,} tokens in {self.chunks:,} chunks, "
                f"{rate:,.0f} tokens/s",
                file=sys.stderr,
                flush=True,
            )


def _emit(out: np.ndarray, mode: str) -> np.ndarray:
    if mode == "mean":
        return np.asarray(out.mean(axis=0, dtype=np.float64), dtype=out.dtype)
    if mode == "last":
        return np.ascontiguousarray(out[-1])
    return out


class SequenceDoFn(beam.DoFn):
    """Stateful DoFn over (seq_id, Chunk): emits ChunkResult, and DeadLetter on `dead_letters`."""

    STATE = ReadModifyWriteStateSpec("state", BytesCoder())
    META = ReadModifyWriteStateSpec("meta", BytesCoder())
    BUFFER = BagStateSpec("buffer", ChunkCoder())
    IDLE = TimerSpec("idle", TimeDomain.WATERMARK)

    def __init__(
        self,
        step: ChunkStep,
        *,
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 16,
        checkpoint_keep: int = 2,
        resume: bool = False,
        max_buffered_chunks: int = 64,
        idle_timeout: float = 300.0,
        emit: str = "tokens",
        progress_every_s: float | None = None,
        restore_fallback: bool = False,
    ) -> None:
        if emit not in EMIT_MODES:
            msg = f"emit must be one of {EMIT_MODES}, got {emit!r}"
            raise ValueError(msg)
        if checkpoint_every < 1:
            msg = f"checkpoint_every must be >= 1, got {checkpoint_every}"
            raise ValueError(msg)
        if max_buffered_chunks < 0:
            msg = f"max_buffered_chunks must be >= 0, got {max_buffered_chunks}"
            raise ValueError(msg)
        if resume and not checkpoint_dir:
            msg = "resume=True needs a checkpoint_dir to resume from"
            raise ValueError(msg)
        self.step = step
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = int(checkpoint_every)
        self.checkpoint_keep = int(checkpoint_keep)
        self.resume = bool(resume)
        self.max_buffered_chunks = int(max_buffered_chunks)
        self.idle_timeout = float(idle_timeout)
        self.emit = emit
        self.progress_every_s = progress_every_s
        # Falling back past a corrupt newest commit is the caller's explicit choice (logged by
        # the store); without it the sequence's chunks go to the dead letters (restore_failed).
        self.restore_fallback = bool(restore_fallback)
        self._store: CheckpointStore | None = None
        self._m: _Counters | None = None
        self._progress: _Progress | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def setup(self) -> None:
        self.step.setup()
        if self.checkpoint_dir:
            self._store = CheckpointStore(self.checkpoint_dir, keep=self.checkpoint_keep)
        self._m = _Counters()
        self._progress = _Progress(self.progress_every_s)

    @property
    def m(self) -> _Counters:
        if self._m is None:
            self._m = _Counters()
        return self._m

    # -- helpers ----------------------------------------------------------------------------
    def _dead(self, seq_id: str, index: Any, reason: str, message: str) -> beam.pvalue.TaggedOutput:
        self.m.dead(reason)
        idx = int(index) if _is_int(index) else None
        if idx is None:
            message = f"{message} (chunk index {index!r})"
        text = f"sequence {seq_id!r}, chunk {index!r}: {message}"
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, DeadLetter(seq_id, idx, reason, text))

    def _load(self, seq_id: str, raw: bytes | None, meta: _Meta) -> SequenceState | None:
        """The sequence's state: from Beam state, else restored from the store, else None."""
        if raw is not None:
            return decode_state(raw, expected_fingerprint=self.step.fingerprint)
        if self._store is not None and (meta.evicted or (self.resume and not meta.seen)):
            st = self._store.restore(
                seq_id, fingerprint=self.step.fingerprint, fallback=self.restore_fallback
            )
            if st is not None and meta.evicted and st.next_chunk != meta.committed_next:
                msg = (
                    f"sequence {seq_id!r} was evicted after committing chunk "
                    f"{meta.committed_next - 1}, but the newest checkpoint in "
                    f"{self.checkpoint_dir!r} continues after chunk {st.next_chunk - 1}: another "
                    "job wrote to this checkpoint directory (use a fresh one, or --resume)"
                )
                raise CheckpointError(msg)
            if st is not None:
                self.m.restores.inc()
                return st
            if meta.evicted:
                msg = (
                    f"sequence {seq_id!r} was evicted to the checkpoint store "
                    f"{self.checkpoint_dir!r}, but no checkpoint of it could be restored"
                )
                raise CheckpointError(msg)
        return None

    def _commit(self, st: SequenceState, meta: _Meta) -> SequenceState:
        if self._store is None or meta.committed_next == st.next_chunk:
            return st
        try:
            outcome = self._store.commit(st)
        except CheckpointError as ex:
            msg = (
                f"sequence {st.seq_id!r}, chunk {st.next_chunk - 1}: checkpoint commit to "
                f"{self.checkpoint_dir!r} failed: {ex}.  A checkpoint directory left by a job "
                "over other data is not resumable with this input: use --resume to continue "
                "it or a fresh --checkpoint-dir"
            )
            raise CheckpointError(msg) from ex
        self.m.commits.inc()
        meta.committed_next = st.next_chunk
        if outcome == "duplicate":
            self.m.commit_duplicates.inc()
        elif outcome == "equal_within_tolerance":
            # A retried bundle computed the same state up to the last bits: continue from the
            # state already committed so that every later commit extends the same history.
            self.m.commit_equal_within_tolerance.inc()
            kept = self._store.restore(st.seq_id, fingerprint=self.step.fingerprint)
            if kept is not None and kept.next_chunk == st.next_chunk:
                return kept
        return st

    def _set_timer(self, timer: Any, meta: _Meta, ts: Timestamp) -> None:
        target = ts + Duration.of(self.idle_timeout) if ts < MAX_TIMESTAMP else MAX_TIMESTAMP
        target = min(target, MAX_TIMESTAMP)
        if target.micros > meta.timer_micros:
            meta.timer_micros = target.micros
        timer.set(Timestamp(micros=meta.timer_micros))

    # -- elements ---------------------------------------------------------------------------
    def process(
        self,
        element: tuple[str, Chunk],
        ts: Any = beam.DoFn.TimestampParam,
        state: Any = beam.DoFn.StateParam(STATE),  # noqa: B008
        meta_state: Any = beam.DoFn.StateParam(META),  # noqa: B008
        buffer: Any = beam.DoFn.StateParam(BUFFER),  # noqa: B008
        idle: Any = beam.DoFn.TimerParam(IDLE),  # noqa: B008
    ) -> Iterator[Any]:
        seq_id, chunk = element
        idx = chunk.index
        # 1. What can be judged from the chunk alone.
        if not _is_int(idx):
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

        # 2. Where the sequence stands.
        meta = _Meta(meta_state.read())
        raw = state.read()
        try:
            st = self._load(seq_id, raw, meta)
        except CheckpointError as ex:
            yield self._dead(seq_id, idx, "restore_failed", str(ex))
            return
        restored = raw is None and st is not None
        meta.seen = True
        wrote = yield from self._order(seq_id, idx, chunk, data, st, meta, state, buffer)
        if restored and not wrote and st is not None:
            state.write(encode_state(st))  # keep the restored state: restore once per return
        if restored:
            meta.evicted = False
        self._set_timer(idle, meta, ts)
        meta_state.write(meta.pack())

    def _order(
        self,
        seq_id: str,
        idx: int,
        chunk: Chunk,
        data: Any,
        st: SequenceState | None,
        meta: _Meta,
        state: Any,
        buffer: Any,
    ) -> Generator[Any, None, bool]:
        """Buffer, drop or apply one valid chunk; returns whether it wrote the Beam state."""
        next_chunk = 0 if st is None else st.next_chunk
        done = meta.final_index >= 0 and next_chunk > meta.final_index

        if meta.final_index >= 0 and idx > meta.final_index:
            yield self._dead(
                seq_id,
                idx,
                "after_final",
                f"expected no chunk after the final chunk {meta.final_index}",
            )
            return False
        if chunk.final and meta.final_index >= 0 and idx != meta.final_index and not done:
            yield self._dead(
                seq_id,
                idx,
                "after_final",
                f"chunk {idx} is marked final, but chunk {meta.final_index} already was",
            )
            return False
        if idx < next_chunk:
            self.m.duplicates.inc()
            return False

        if idx > next_chunk:
            # 3a. Early: buffer it (bounded) until its predecessors arrive.
            if idx - next_chunk > self.max_buffered_chunks:
                yield self._dead(
                    seq_id,
                    idx,
                    "beyond_buffer",
                    f"expected a chunk index below {next_chunk + self.max_buffered_chunks + 1} "
                    f"(next to apply is {next_chunk}, at most {self.max_buffered_chunks} "
                    "chunks are buffered ahead of it)",
                )
                return False
            if meta.n_buffered and any(c.index == idx for c in buffer.read()):
                self.m.duplicates.inc()
                return False
            buffer.add(Chunk(seq_id, idx, chunk.data, chunk.final))
            meta.n_buffered += 1
            self.m.buffered.inc()
            if meta.n_buffered == 1:
                self.m.gaps.inc()  # a gap opened: chunk `next_chunk` is missing for now
            if chunk.final:
                meta.final_index = idx
                yield from self._drop_after_final(seq_id, idx, meta, buffer)
            return False

        # 3b. In order: apply it, then whatever the buffer holds right behind it.
        ready: list[tuple[int, Any, bool]] = [(idx, data, chunk.final)]
        pending: list[Chunk] = []
        if meta.n_buffered:
            pending = sorted(buffer.read(), key=lambda c: int(c.index))
        changed = False
        while ready:
            cidx, cdata, cfinal = ready.pop()
            try:
                start_st = (
                    st
                    if st is not None
                    else SequenceState.initial(
                        seq_id,
                        self.step.state_shape(cdata),
                        self.step.fingerprint,
                        dtype=self.step.state_dtype,
                    )
                )
            except (ValueError, TypeError) as ex:  # e.g. a zero-sized head or width
                yield self._dead(seq_id, cidx, "bad_shape", f"{type(ex).__name__}: {ex}")
                break
            st = start_st
            try:
                t0 = time.perf_counter()
                out, layers = self.step.apply(cdata, st.layers())
                self.m.kernel_time.update(int((time.perf_counter() - t0) * 1e6))
            except BadInput as bad:
                yield self._dead(seq_id, cidx, bad.reason, bad.message)
                break
            except (ValueError, TypeError, FloatingPointError) as ex:
                yield self._dead(seq_id, cidx, "compute_error", f"{type(ex).__name__}: {ex}")
                break
            if not _all_finite(out, layers):
                # Finite inputs can still overflow (values near the float range): the chunk is
                # refused and the sequence keeps the state it had before it.
                yield self._dead(
                    seq_id,
                    cidx,
                    "non_finite",
                    "expected finite outputs and state, but the chunk's result overflowed to "
                    "Inf or NaN (inputs too large)",
                )
                break
            n = self.step.tokens(cdata)
            start = st.position
            st = SequenceState.from_layers(
                seq_id, st.position + n, cidx + 1, layers, self.step.fingerprint
            )
            changed = True
            if cfinal:
                meta.final_index = cidx
            if st.next_chunk - max(meta.committed_next, 0) >= self.checkpoint_every or cfinal:
                st = self._commit(st, meta)
            self.m.chunks.inc()
            self.m.tokens.inc(n)
            if self._progress is not None:
                self._progress.add(n)
            yield ChunkResult(seq_id, cidx, start, _emit(out, self.emit))
            if cfinal:  # nothing after the final chunk is applied
                for c in pending:
                    yield self._after_final(seq_id, int(c.index), cidx)
                pending = []
                break
            while pending and int(pending[0].index) < st.next_chunk:
                pending.pop(0)  # superseded (cannot happen unless a duplicate slipped in)
            if pending and int(pending[0].index) == st.next_chunk:
                c = pending.pop(0)
                try:
                    cdata = self.step.validate(c.data)
                except BadInput as bad:  # validated before buffering; kept for safety
                    yield self._dead(seq_id, c.index, bad.reason, bad.message)
                    continue
                ready.append((int(c.index), cdata, c.final))
        if meta.n_buffered and len(pending) != meta.n_buffered:
            buffer.clear()
            for c in pending:
                buffer.add(c)
            meta.n_buffered = len(pending)
            if pending:
                self.m.gaps.inc()  # still waiting: another gap behind the applied run
        if changed and st is not None:
            state.write(encode_state(st))
        return changed

    def _after_final(self, seq_id: str, idx: int, final_index: int) -> Any:
        return self._dead(
            seq_id, idx, "after_final", f"expected no chunk after the final chunk {final_index}"
        )

    def _drop_after_final(
        self, seq_id: str, final_index: int, meta: _Meta, buffer: Any
    ) -> Iterator[Any]:
        """Dead-letter buffered chunks beyond a final chunk that has just been buffered."""
        kept = [c for c in buffer.read() if int(c.index) <= final_index]
        if len(kept) == meta.n_buffered:
            return
        for c in buffer.read():
            if int(c.index) > final_index:
                yield self._after_final(seq_id, int(c.index), final_index)
        buffer.clear()
        for c in kept:
            buffer.add(c)
        meta.n_buffered = len(kept)

    # -- idle -------------------------------------------------------------------------------
    @on_timer(IDLE)
    def on_idle(
        self,
        key: Any = beam.DoFn.KeyParam,
        state: Any = beam.DoFn.StateParam(STATE),  # noqa: B008
        meta_state: Any = beam.DoFn.StateParam(META),  # noqa: B008
        buffer: Any = beam.DoFn.StateParam(BUFFER),  # noqa: B008
    ) -> Iterator[Any]:
        seq_id = str(key)
        meta = _Meta(meta_state.read())
        raw = state.read()
        st = None if raw is None else decode_state(raw, expected_fingerprint=self.step.fingerprint)
        next_chunk = 0 if st is None else st.next_chunk
        if meta.n_buffered:
            for c in sorted(buffer.read(), key=lambda c: int(c.index)):
                yield self._dead(
                    seq_id,
                    c.index,
                    "gap",
                    f"waited for chunk {next_chunk}, which did not arrive before the sequence "
                    f"went idle; resend chunks from {next_chunk} on to continue it",
                )
            buffer.clear()
            meta.n_buffered = 0
        if st is not None and self._store is not None:
            st = self._commit(st, meta)
            state.clear()
            meta.evicted = True
            self.m.evictions.inc()
        meta_state.write(meta.pack())


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
