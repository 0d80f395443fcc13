"""The reading stage's progress lines: what a reader has read so far, and when its bundle ends.

Logged at INFO to the logger `linstream.read` (the `linstream` command shows them with `-v`): a
line every `every_s` seconds while a reader works, and one when its bundle ends, so that a job
that spends minutes reading and tokenizing before the first chunk is embedded says so.  Each
worker reports its own share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["ReadProgress"]

_log = logging.getLogger("linstream.read")


class ReadProgress:
    """Counts of one reader (`what`: "read", "cut", ...), formatted by `describe(counts)`."""

    def __init__(
        self,
        describe: Callable[[dict[str, int]], str],
        *,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.describe, self.every_s, self._clock = describe, every_s, clock
        self._log = log or _log.info
        self.counts: dict[str, int] = {}
        self._last = clock()

    def add(self, **counts: int) -> None:
        for name, n in counts.items():
            self.counts[name] = self.counts.get(name, 0) + int(n)
        now = self._clock()
        if now - self._last >= self.every_s:
            self._last = now
            self._log(f"{self.describe(self.counts)} so far")

    def done(self) -> None:
        """The bundle ended: one line with its counts (none when it read nothing)."""
        if self.counts:
            self._log(self.describe(self.counts))
        self.counts = {}
        self._last = self._clock()
