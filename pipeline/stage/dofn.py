"""`SequenceDoFn`: the Beam adapter over `SequenceStage` (sequence_stage.py), which holds the logic.

Per sequence id (the key) Beam holds one read-modify-write cell, `seq`, read and written once
per element (cells.py), two bags for buffered chunks and held outputs that do not fit in it
(`buffer`, `outbuf`), and an event-time timer, `idle`, that fires when the sequence has been idle
for `idle_timeout` seconds of event time (at the end of input in a batch job).  This class
declares them, hands them to the stage, and sends the stage's dead letters to the
``dead_letters`` output; the lifecycle methods delegate to the stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Timestamp
from linstream.pipeline.elements import Chunk, ChunkCoder, ChunkResultCoder, DeadLetter

from .cells import StateCells
from .counters import NAMESPACE
from .sequence_stage import Output, SequenceStage

__all__ = ["DEAD_LETTERS", "BeamMetrics", "SequenceDoFn"]

#: The tag of the dead-letter output.
DEAD_LETTERS = "dead_letters"


class BeamMetrics:
    """Beam's metrics under ``namespace`` (what the runner reports and the job prints): the
    stage's counters on a runner."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace

    def counter(self, name: str) -> Any:
        return Metrics.counter(self.namespace, name)

    def distribution(self, name: str) -> Any:
        return Metrics.distribution(self.namespace, name)


class _Timer:
    """Beam's timer object, set in the stage's microseconds."""

    __slots__ = ("timer",)

    def __init__(self, timer: Any) -> None:
        self.timer = timer

    def set(self, event_time_us: int) -> None:
        self.timer.set(Timestamp(micros=event_time_us))


def _tagged(outputs: Iterable[Output]) -> Iterator[Any]:
    for out in outputs:
        yield beam.pvalue.TaggedOutput(DEAD_LETTERS, out) if isinstance(out, DeadLetter) else out


class SequenceDoFn(beam.DoFn):
    """Stateful DoFn over (seq_id, Chunk): emits ChunkResult, and DeadLetter on `dead_letters`."""

    SEQ = ReadModifyWriteStateSpec("seq", BytesCoder())
    BUFFER = BagStateSpec("buffer", ChunkCoder())
    OUTBUF = BagStateSpec("outbuf", ChunkResultCoder())
    IDLE = TimerSpec("idle", TimeDomain.WATERMARK)

    def __init__(self, stage: SequenceStage) -> None:
        self.stage = stage

    def setup(self) -> None:
        self.stage.setup()

    def start_bundle(self) -> None:
        self.stage.start_bundle()

    def finish_bundle(self) -> None:
        self.stage.finish_bundle()

    def teardown(self) -> None:
        self.stage.teardown()

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
        cells = StateCells(seq, buffer, outbuf)
        outputs = self.stage.process(
            seq_id, chunk, cells, event_time_us=ts.micros, timer=_Timer(idle)
        )
        yield from _tagged(outputs)

    @on_timer(IDLE)
    def on_idle(
        self,
        key: Any = beam.DoFn.KeyParam,
        seq: Any = beam.DoFn.StateParam(SEQ),  # noqa: B008
        buffer: Any = beam.DoFn.StateParam(BUFFER),  # noqa: B008
        outbuf: Any = beam.DoFn.StateParam(OUTBUF),  # noqa: B008
    ) -> Iterator[Any]:
        yield from _tagged(self.stage.on_idle(str(key), StateCells(seq, buffer, outbuf)))
