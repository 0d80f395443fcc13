"""In-memory stand-ins for what a runner gives the stateful stage: one key's state cells, its
idle timer, and a metrics source whose counts a test reads.

A bag keeps its values encoded with the coder Beam's bag uses (as the runner does), so a value
that a coder changes comes back changed here too.
"""

from __future__ import annotations

from typing import Any

from apache_beam.utils.timestamp import Timestamp
from linstream.pipeline.elements import ChunkCoder, ChunkResultCoder
from linstream.pipeline.stage.cells import StateCells

__all__ = ["FakeBag", "FakeCell", "FakeKey", "FakeTimer", "MemoryMetrics"]


class FakeCell:
    """A read-modify-write cell."""

    def __init__(self) -> None:
        self.value: Any = None

    def read(self) -> Any:
        return self.value

    def write(self, value: Any) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


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

    def set(self, timestamp: Timestamp) -> None:
        self.when = timestamp


class FakeKey:
    """One key's state and timer, kept between elements as a runner keeps them."""

    def __init__(self) -> None:
        self.seq = FakeCell()
        self.buffer = FakeBag(ChunkCoder())
        self.outbuf = FakeBag(ChunkResultCoder())
        self.timer = FakeTimer()

    @property
    def cells(self) -> StateCells:
        return StateCells(self.seq, self.buffer, self.outbuf)


class _Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: int = 1) -> None:
        self.value += n


class _Spread:
    def __init__(self) -> None:
        self.values: list[int] = []

    def update(self, value: int) -> None:
        self.values.append(int(value))


class MemoryMetrics:
    """A `MetricSource` that keeps its counts: ``counts`` as `_query_metrics` reports them
    (counters that were never incremented are absent)."""

    def __init__(self) -> None:
        self._counters: dict[str, _Count] = {}
        self.distributions: dict[str, _Spread] = {}

    def counter(self, name: str) -> _Count:
        return self._counters.setdefault(name, _Count())

    def distribution(self, name: str) -> _Spread:
        return self.distributions.setdefault(name, _Spread())

    @property
    def counts(self) -> dict[str, int]:
        return {name: c.value for name, c in self._counters.items() if c.value}
