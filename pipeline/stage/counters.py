"""The stage's counters: Beam metrics under the namespace ``linstream``, from an injected source.

A runner reports what `BeamMetrics` counts; a test hands the stage a source of its own (an
in-memory one) and reads the same counts without a runner.
"""

from __future__ import annotations

from typing import Any, Protocol

from apache_beam.metrics import Metrics

__all__ = ["NAMESPACE", "BeamMetrics", "Counter", "Counters", "Distribution", "MetricSource"]

NAMESPACE = "linstream"


class Counter(Protocol):
    def inc(self, n: int = 1) -> None: ...


class Distribution(Protocol):
    def update(self, value: int) -> None: ...


class MetricSource(Protocol):
    """Where counters come from: Beam's metrics, or an in-memory stand-in in tests."""

    def counter(self, name: str) -> Counter: ...

    def distribution(self, name: str) -> Distribution: ...


class BeamMetrics:
    """Beam's metrics under ``namespace`` (what the runner reports and the job prints)."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace

    def counter(self, name: str) -> Any:
        return Metrics.counter(self.namespace, name)

    def distribution(self, name: str) -> Any:
        return Metrics.distribution(self.namespace, name)


class Counters:
    """Every counter the stage keeps (README lists them), and dead letters by reason."""

    def __init__(self, metrics: MetricSource | None = None) -> None:
        m: MetricSource = BeamMetrics() if metrics is None else metrics
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
