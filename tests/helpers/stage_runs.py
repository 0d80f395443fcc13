"""Drive the stateful stage without a runner, the way a runner feeds it.

`StageRun` is one job: each chunk goes through Beam's chunk coder (as it does on its way to the
stateful DoFn), each key keeps its own in-memory state and timer (fake_state.py), a timer fires
when the watermark passes it (`advance_to`) and every timer still set fires at the end of the
input (`finish`, as in a batch job).  `run_stage(chunks, transform)` is `run_transform` of
tests/pipeline without the runner, and returns the same `Run`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from linstream.pipeline.elements import Chunk, ChunkCoder, ChunkResult, DeadLetter
from linstream.pipeline.stage.sequence_stage import Output, SequenceStage

from helpers.fake_state import FakeKey, MemoryMetrics

__all__ = ["Run", "StageRun", "run_stage"]

_CHUNKS = ChunkCoder()


class Run:
    """Outputs and counters of one job."""

    def __init__(self, results: list[ChunkResult], dead: list[DeadLetter], counters: dict) -> None:
        self.results = sorted(results, key=lambda r: (r.seq_id, r.index))
        self.dead = sorted(dead, key=lambda d: (d.seq_id, str(d.chunk_index), d.reason, d.message))
        self.counters = counters

    def by_key(self) -> dict[tuple[str, int], ChunkResult]:
        return {(r.seq_id, r.index): r for r in self.results}


class StageRun:
    """One job of the stage of ``transform`` (a CausalLinearAttention or EmbedSequences: its
    public ``step`` and ``config`` make the stage), counting into ``metrics``."""

    def __init__(self, transform: Any) -> None:
        self.metrics = MemoryMetrics()
        self.stage = SequenceStage(transform.step, transform.config, metrics=self.metrics)
        self.stage.setup()
        self.keys: dict[str, FakeKey] = {}
        self.results: list[ChunkResult] = []
        self.dead: list[DeadLetter] = []

    def _keep(self, outputs: Iterable[Output]) -> list[Output]:
        out = list(outputs)
        self.dead += [o for o in out if isinstance(o, DeadLetter)]
        self.results += [o for o in out if isinstance(o, ChunkResult)]
        return out

    def send(self, chunk: Chunk, at: float | Timestamp = MIN_TIMESTAMP) -> list[Output]:
        """One element with event time ``at`` (seconds; by default that of `beam.Create`'s
        elements); what the stage emitted for it."""
        chunk = _CHUNKS.decode(_CHUNKS.encode(chunk))
        seq_id = str(chunk.seq_id)
        key = self.keys.setdefault(seq_id, FakeKey())
        ts = at if isinstance(at, Timestamp) else Timestamp.of(at)
        return self._keep(
            self.stage.process(seq_id, chunk, key.cells, event_time_us=ts.micros, timer=key.timer)
        )

    def idle(self, seq_id: str) -> list[Output]:
        """Fire the key's idle timer now."""
        key = self.keys.setdefault(seq_id, FakeKey())
        key.timer.when = None
        return self._keep(self.stage.on_idle(seq_id, key.cells))

    def advance_to(self, watermark: float | Timestamp) -> list[Output]:
        """Fire every timer set at or before ``watermark`` (in time order)."""
        mark = watermark if isinstance(watermark, Timestamp) else Timestamp.of(watermark)
        due = sorted(
            (k.timer.when, seq_id)
            for seq_id, k in self.keys.items()
            if k.timer.when is not None and k.timer.when <= mark
        )
        out: list[Output] = []
        for _when, seq_id in due:
            out += self.idle(seq_id)
        return out

    def finish(self) -> Run:
        """The end of the input: every timer fires, the bundle ends, the worker tears down."""
        try:
            self.advance_to(MAX_TIMESTAMP)
            self.stage.finish_bundle()
        finally:
            self.stage.teardown()
        return Run(self.results, self.dead, self.metrics.counts)


def run_stage(chunks: Iterable[Chunk], transform: Any) -> Run:
    """One batch job over ``chunks`` (in this order), without a runner."""
    job = StageRun(transform)
    for chunk in chunks:
        job.send(chunk)
    return job.finish()
