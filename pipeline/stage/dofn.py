"""The stateful stage shared by every transform: order chunks, carry the state, checkpoint it.

Per sequence id (the key) Beam holds one read-modify-write cell, `seq`, read and written once
per element (cells.py: the meta record, the digests of the newest applied chunks, the index of
buffered chunks, the working copy of the state, and while they are small the outputs since the
last commit and the buffered chunks themselves), and two bags for buffered chunks and held
outputs that do not fit in it (`buffer`, `outbuf`; read only when the meta record says they
hold something).
Chunk i is applied only after 0..i-1.  Every `checkpoint_every` chunks and at the final chunk the
state is committed to the CheckpointStore as the next commit of the sequence's chain, together
with the output span of the chunks it covers (spans.py) when `output_dir` is set.  An event-time
timer fires when a sequence has been idle for `idle_timeout` seconds of event time (at the end of
input in a batch job): it dead-letters chunks still waiting behind a gap, commits what is
uncommitted and clears the Beam state; the sequence is restored from the store when it returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp
from linstream.pipeline.elements import Chunk, ChunkCoder, ChunkResultCoder, DeadLetter
from linstream.state import CheckpointError, CheckpointStore, SequenceState, unpack_state

from .applier import Applier, Counters, is_int
from .cells import Cells
from .commits import Commits
from .ordering import OrderedApply
from .progress import Progress
from .records import DigestWindow, Meta, chunk_digest
from .spans import SpanWriter
from .steps import BadInput, ChunkStep

__all__ = ["DEAD_LETTERS", "EMIT_MODES", "NAMESPACE", "SequenceDoFn"]

DEAD_LETTERS = "dead_letters"
#: tokens: one vector per token; mean / last: one per chunk; sequence: one per finished sequence
#: (the mean over all its tokens, from a running sum carried with the state).
EMIT_MODES = ("tokens", "mean", "last", "sequence")
NAMESPACE = "linstream"


class SequenceDoFn(OrderedApply, beam.DoFn):
    """Stateful DoFn over (seq_id, Chunk): emits ChunkResult, and DeadLetter on `dead_letters`."""

    SEQ = ReadModifyWriteStateSpec("seq", BytesCoder())
    BUFFER = BagStateSpec("buffer", ChunkCoder())
    OUTBUF = BagStateSpec("outbuf", ChunkResultCoder())
    IDLE = TimerSpec("idle", TimeDomain.WATERMARK)

    def __init__(
        self,
        step: ChunkStep,
        *,
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 16,
        checkpoint_keep: int = 2,
        resume: bool = False,
        max_buffered_chunks: int | None = None,
        idle_timeout: float = 300.0,
        emit: str = "tokens",
        progress_every_s: float | None = None,
        restore_fallback: bool = False,
        output_dir: str | None = None,
        max_chunk_tokens: int = 1 << 20,
        block_tokens: int = 8192,
        total_tokens: int | None = None,
    ) -> None:
        if emit not in EMIT_MODES:
            msg = f"emit must be one of {EMIT_MODES}, got {emit!r}"
            raise ValueError(msg)
        if checkpoint_every < 1:
            msg = f"checkpoint_every must be >= 1, got {checkpoint_every}"
            raise ValueError(msg)
        if max_buffered_chunks is not None and max_buffered_chunks < 0:
            msg = f"max_buffered_chunks must be >= 0 or None, got {max_buffered_chunks}"
            raise ValueError(msg)
        if resume and not checkpoint_dir:
            msg = "resume=True needs a checkpoint_dir to resume from"
            raise ValueError(msg)
        if output_dir and not checkpoint_dir:
            msg = "output_dir (outputs written with the commits) needs a checkpoint_dir"
            raise ValueError(msg)
        if max_chunk_tokens < 1 or block_tokens < 1:
            msg = (
                "max_chunk_tokens and block_tokens must be >= 1, got "
                f"{max_chunk_tokens} and {block_tokens}"
            )
            raise ValueError(msg)
        self.step = step
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = int(checkpoint_every)
        self.checkpoint_keep = int(checkpoint_keep)
        self.resume = bool(resume)
        self.max_buffered_chunks = max_buffered_chunks
        self.idle_timeout = float(idle_timeout)
        self.emit = emit
        self.progress_every_s = progress_every_s
        # Falling back past a corrupt newest commit is the caller's explicit choice (logged by
        # the store); without it the sequence's chunks go to the dead letters (restore_failed).
        self.restore_fallback = bool(restore_fallback)
        self.output_dir = output_dir
        self.max_chunk_tokens = int(max_chunk_tokens)
        self.block_tokens = int(block_tokens)
        self.total_tokens = total_tokens  # for the progress line's ETA, when known
        self._store: CheckpointStore | None = None
        self._commits: Commits | None = None
        self._m: Counters | None = None
        self._applier: Applier | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def setup(self) -> None:
        self.step.setup()
        self._m = Counters(NAMESPACE)
        if self.checkpoint_dir:
            self._store = CheckpointStore(self.checkpoint_dir, keep=self.checkpoint_keep)
            spans = None
            if self.output_dir:
                spans = SpanWriter(self.output_dir, per_token=self.emit == "tokens")
            self._commits = Commits(
                self._store,
                spans,
                self.step,
                self._m,
                emit=self.emit,
                restore_fallback=self.restore_fallback,
            )

    @property
    def m(self) -> Counters:
        if self._m is None:
            self._m = Counters(NAMESPACE)
        return self._m

    @property
    def applier(self) -> Applier:
        if self._applier is None:
            self._applier = Applier(
                self.step,
                self.m,
                Progress(self.progress_every_s, self.total_tokens),
                emit=self.emit,
                max_chunk_tokens=self.max_chunk_tokens,
                block_tokens=self.block_tokens,
            )
        return self._applier

    def finish_bundle(self) -> None:
        if self._commits is not None:
            self._commits.flush()  # every span this bundle committed is published

    def teardown(self) -> None:
        try:
            if self._commits is not None:
                self._commits.close()
        finally:
            if self._store is not None:
                self._store.close()

    # -- helpers ----------------------------------------------------------------------------
    def _dead(self, seq_id: str, index: Any, reason: str, message: str) -> beam.pvalue.TaggedOutput:
        self.m.dead(reason)
        idx = int(index) if is_int(index) else None
        if idx is None:
            message = f"{message} (chunk index {index!r})"
        text = f"sequence {seq_id!r}, chunk {index!r}: {message}"
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, DeadLetter(seq_id, idx, reason, text))

    def _commit(
        self, seq_id: str, st: SequenceState, meta: Meta, cells: Cells
    ) -> Iterator[beam.pvalue.TaggedOutput | SequenceState]:
        """Commit ``st`` (and its output span); yields dead letters, then the state to go on."""
        if self._commits is None:
            yield st
            return
        first = max(meta.committed_next, 0)
        st, refused = self._commits.commit(seq_id, st, meta, cells)
        if refused is not None:
            for i in range(first, st.next_chunk):
                yield self._dead(
                    seq_id,
                    i,
                    "fenced",
                    f"{refused}; this job's output for the chunk is not kept. Resume with "
                    "--resume after the other job ends, or use a fresh checkpoint folder",
                )
        yield st

    def _evict(self, meta: Meta, cells: Cells) -> None:
        """Clear the Beam state of a committed sequence (restored from the store if it returns)."""
        cells.set_state(None)
        cells.window = DigestWindow(None)
        cells.clear_outputs()
        cells.outsum = None
        meta.evicted = True
        self.m.evictions.inc()

    def _set_timer(self, timer: Any, meta: Meta, ts: Timestamp) -> None:
        target = ts + Duration.of(self.idle_timeout) if ts < MAX_TIMESTAMP else MAX_TIMESTAMP
        target = min(target, MAX_TIMESTAMP)
        if target.micros > meta.timer_micros:
            # Only when the target moves: a batch job's elements all carry one timestamp, and
            # setting the same timer again per element costs the runner per element.
            meta.timer_micros = target.micros
            timer.set(Timestamp(micros=meta.timer_micros))

    # -- elements ---------------------------------------------------------------------------
    def process(
        self,
        element: tuple[str, Chunk],
        ts: Any = beam.DoFn.TimestampParam,
        seq: Any = beam.DoFn.StateParam(SEQ),  # noqa: B008
        buffer: Any = beam.DoFn.StateParam(BUFFER),  # noqa: B008
        outbuf: Any = beam.DoFn.StateParam(OUTBUF),  # noqa: B008
        idle: Any = beam.DoFn.TimerParam(IDLE),  # noqa: B008
    ) -> Iterator[Any]:
        seq_id, chunk = element
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
        cells = Cells(seq, buffer, outbuf)
        meta = cells.meta
        if meta.fenced:
            yield self._dead(
                seq_id, idx, "fenced", "another job advanced this sequence; this job stopped it"
            )
            return
        raw = cells.state_raw
        st: SequenceState | None
        try:
            if raw is not None:
                st = unpack_state(raw, expected_fingerprint=self.step.fingerprint)
            elif self._commits is not None and (meta.evicted or (self.resume and not meta.seen)):
                st = self._commits.restore(seq_id, data, meta, cells)
                if st is not None:
                    cells.set_state(st)  # restore once per return of the sequence
            else:
                st = None
        except CheckpointError as ex:
            yield self._dead(seq_id, idx, "restore_failed", self.step.restore_message(ex))
            return
        except (ValueError, TypeError) as ex:  # the payload has no valid state shape
            yield self._dead(seq_id, idx, "bad_shape", f"{type(ex).__name__}: {ex}")
            return
        meta.seen, meta.evicted = True, False
        yield from self._order(seq_id, idx, chunk.final, data, digest, st, meta, cells)
        self._set_timer(idle, meta, ts)
        cells.flush()

    # -- idle -------------------------------------------------------------------------------
    @on_timer(IDLE)
    def on_idle(
        self,
        key: Any = beam.DoFn.KeyParam,
        seq: Any = beam.DoFn.StateParam(SEQ),  # noqa: B008
        buffer: Any = beam.DoFn.StateParam(BUFFER),  # noqa: B008
        outbuf: Any = beam.DoFn.StateParam(OUTBUF),  # noqa: B008
    ) -> Iterator[Any]:
        seq_id = str(key)
        cells = Cells(seq, buffer, outbuf)
        meta = cells.meta
        raw = cells.state_raw
        st = None if raw is None else unpack_state(raw, expected_fingerprint=self.step.fingerprint)
        next_chunk = 0 if st is None else st.next_chunk
        if len(cells.index):
            for i in cells.index.rows["index"]:
                yield self._dead(
                    seq_id,
                    int(i),
                    "gap",
                    f"waited for chunk {next_chunk}, which did not arrive before the sequence "
                    f"went idle; resend chunks from {next_chunk} on to continue it",
                )
            cells.clear_chunks()
        if st is not None and self._commits is not None and not meta.fenced:
            for item in self._commit(seq_id, st, meta, cells):
                if not isinstance(item, SequenceState):
                    yield item
            self._evict(meta, cells)
            meta.evicted = not meta.fenced
        meta.timer_micros = MIN_TIMESTAMP.micros  # fired: the next element sets it again
        cells.flush()
