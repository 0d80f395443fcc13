"""The progress line: tokens done (of the total when it is known), tokens/s and the ETA.

Logged through `logging` (logger `linstream.progress`, level INFO); the `linstream` command
shows it on stderr.  The total is what the job has to do, counted before the run
(`linstream.pipeline.app.work_left`: the input's tokens from Parquet footers or text file sizes,
less what a resumed job's checkpoints already hold); each worker reports its own share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["Progress", "format_eta"]

_log = logging.getLogger("linstream.progress")


def format_eta(seconds: float) -> str:
    """`42 s`, `3 min 20 s`, `2 h 05 min`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class Progress:
    """Counts tokens and logs a line every `every_s` seconds (None: never).

    `add(tokens)` after each applied chunk; `line()` is the current line.
    """

    def __init__(
        self,
        every_s: float | None,
        total_tokens: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.every_s = every_s
        self.total = total_tokens if total_tokens and total_tokens > 0 else None
        self._clock = clock
        self._log = log or _log.info
        self.start = self.last = clock()
        self.tokens = 0
        self.chunks = 0

    def add(self, tokens: int) -> None:
        self.tokens += int(tokens)
        self.chunks += 1
        if self.every_s is None:
            return
        now = self._clock()
        if now - self.last >= self.every_s:
            self.last = now
            self._log(self.line(now))

    def line(self, now: float | None = None) -> str:
        now = self._clock() if now is None else now
        elapsed = max(now - self.start, 1e-9)
        rate = self.tokens / elapsed
        done = f"{self.tokens:,} tokens in {self.chunks:,} chunks"
        if self.total is None:
            return f"linstream: {done}, {rate:,.0f} tokens/s"
        share = min(self.tokens / self.total, 1.0)
        left = max(self.total - self.tokens, 0)
        eta = format_eta(left / rate) if rate > 0 else "unknown"
        return (
            f"linstream: {self.tokens:,} / {self.total:,} tokens ({100 * share:.1f}%) in "
            f"{self.chunks:,} chunks, {rate:,.0f} tokens/s, ETA {eta}"
        )
