"""The stage's counters, from an injected source: Beam's metrics on a runner (`BeamMetrics`, in
dofn.py, under the namespace ``linstream``), or `MemoryMetrics`, which keeps its counts (the
one-line API and the tests read them without a runner).  No Beam here.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NAMESPACE", "Counter", "Counters", "Distribution", "MemoryMetrics", "MetricSource"]

NAMESPACE = "linstream"


class Counter(Protocol):
    def inc(self, n: int = 1) -> None: ...


class Distribution(Protocol):
    def update(self, value: int) -> None: ...


class MetricSource(Protocol):
    """Where counters come from: Beam's metrics, or an in-memory stand-in in tests."""

    def counter(self, name: str) -> Counter: ...

    def distribution(self, name: str) -> Distribution: ...


class _Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: int = 1) -> None:
        self.value += n


class _Spread:
    """A distribution as Beam keeps one: count, sum, min and max (memory bounded)."""

    def __init__(self) -> None:
        self.count = self.sum = 0
        self.min: int | None = None
        self.max: int | None = None

    def update(self, value: int) -> None:
        v = int(value)
        self.count, self.sum = self.count + 1, self.sum + v
        self.min = v if self.min is None else min(self.min, v)
        self.max = v if self.max is None else max(self.max, v)


class MemoryMetrics:
    """A `MetricSource` that keeps its counts: ``counts`` as a runner's query reports them
    (counters that were never incremented are absent), ``distributions`` as Beam's (count,
    sum, min, max)."""

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


class Counters:
    """Every counter the stage keeps (README lists them), and dead letters by reason."""

    def __init__(self, metrics: MetricSource | None = None) -> None:
        m: MetricSource = MemoryMetrics() if metrics is None else metrics
        self._metrics = m
        self.chunks = m.counter("chunks")
        self.tokens = m.counter("tokens")
        self.duplicates = m.counter("duplicates")
        self.duplicates_unchecked = m.counter("duplicates_unchecked")
        self.buffered = m.counter("buffered")
        self.gaps = m.counter("gaps")
        self.dead_letters = m.counter("dead_letters")
        self.commits = m.counter("commits")
        self.commit_duplicates = m.counter("commit_duplicates")
        self.commit_equal_within_tolerance = m.counter("commit_equal_within_tolerance")
        self.restores = m.counter("restores")
        self.evictions = m.counter("evictions")
        self.outputs_missing = m.counter("outputs_missing")
        self.kernel_time = m.distribution("kernel_time_us")
        self._by_reason: dict[str, Counter] = {}

    def dead(self, reason: str) -> None:
        """One dead letter: ``dead_letters`` and ``dead_letters.<reason>``."""
        self.dead_letters.inc()
        if reason not in self._by_reason:
            self._by_reason[reason] = self._metrics.counter(f"dead_letters.{reason}")
        self._by_reason[reason].inc()
