"""In-memory stand-ins for what a runner gives the stateful stage: one key's state cells and its
idle timer (the value cell and the metrics source are the stage's own `MemoryCell` and
`MemoryMetrics`).

A bag keeps its values encoded with the coder Beam's bag uses (as the runner does), so a value
that a coder changes comes back changed here too.
"""

from __future__ import annotations

from typing import Any

from apache_beam.utils.timestamp import Timestamp
from linstream.pipeline.elements import ChunkCoder, ChunkResultCoder
from linstream.pipeline.stage.cells import MemoryCell, StateCells
from linstream.pipeline.stage.counters import MemoryMetrics

__all__ = ["FakeBag", "FakeKey", "FakeTimer", "MemoryMetrics"]


class FakeBag:
    """A bag; ``reads`` counts its reads, ``items`` are the decoded values it holds."""

    def __init__(self, coder: Any = None) -> None:
        self.coder = coder
        self._encoded: list[Any] = []
        self.reads = 0

    @property
    def items(self) -> list[Any]:
        return [self._decode(v) for v in self._encoded]

    def _decode(self, v: Any) -> Any:
        return v if self.coder is None else self.coder.decode(v)

    def read(self) -> list[Any]:
        self.reads += 1
        return self.items

    def add(self, value: Any) -> None:
        self._encoded.append(value if self.coder is None else self.coder.encode(value))

    def clear(self) -> None:
        self._encoded = []


class FakeTimer:
    """An event-time timer: ``when`` is the time it is set for (None: not set, or fired)."""

    def __init__(self) -> None:
        self.when: Timestamp | None = None

    def set(self, event_time_us: int) -> None:
        self.when = Timestamp(micros=event_time_us)


class FakeKey:
    """One key's state and timer, kept between elements as a runner keeps them."""

    def __init__(self) -> None:
        self.seq = MemoryCell()
        self.buffer = FakeBag(ChunkCoder())
        self.outbuf = FakeBag(ChunkResultCoder())
        self.timer = FakeTimer()

    @property
    def cells(self) -> StateCells:
        return StateCells(self.seq, self.buffer, self.outbuf)
