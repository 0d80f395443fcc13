"""How a flag's text becomes a value: booleans, whole numbers, `none`, the dead-letter limit.

Each parser raises `argparse.ArgumentTypeError` with "expected X, got Y", which argparse shows as
the flag's error and `EmbedConfig` turns into a usage error naming the flag.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

__all__ = [
    "DeadLetterLimit",
    "chunk_tokens_value",
    "dead_letter_limit_text",
    "non_negative_float",
    "non_negative_int",
    "optional_count",
    "parse_bool",
    "parse_dead_letter_limit",
    "positive_int",
]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(value: str) -> bool:
    """`true|false|1|0|yes|no|on|off` (any case) as a bool."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    msg = f"expected true or false, got {value!r}"
    raise argparse.ArgumentTypeError(msg)


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        msg = f"expected a whole number >= 1, got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return n


def chunk_tokens_value(value: str) -> int:
    """`--chunk-tokens`: a whole number from 1 to the largest chunk the stateful stage takes
    (`StageConfig.max_chunk_tokens`; a longer chunk would be a `too_large` dead letter)."""
    from linstream.pipeline.stage.config import MAX_CHUNK_TOKENS

    n = positive_int(value)
    if n > MAX_CHUNK_TOKENS:
        msg = (
            f"expected at most {MAX_CHUNK_TOKENS:,} tokens per chunk (the largest chunk the "
            f"stage takes; a sequence of any length is cut into chunks and its state carried "
            f"from one to the next), got {value!r}"
        )
        raise argparse.ArgumentTypeError(msg)
    return n


def non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        msg = f"expected a whole number >= 0, got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return n


def optional_count(value: str) -> int | None:
    """`none` (no bound) or a whole number >= 0."""
    if value.strip().lower() == "none":
        return None
    return non_negative_int(value)


def non_negative_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not x >= 0:
        msg = f"expected a number >= 0, got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return x


@dataclass(frozen=True)
class DeadLetterLimit:
    """`--max-dead-letters`: None (no count limit), a count, or a percentage of all chunks."""

    count: int | None = None
    percent: float | None = None

    def exceeded(self, dead: int, chunks: int) -> bool:
        """Whether `dead` dead letters, beside `chunks` applied chunks, pass the limit."""
        if self.count is not None:
            return dead > self.count
        if self.percent is not None:
            total = dead + chunks
            return total > 0 and 100.0 * dead / total > self.percent
        return False

    def __str__(self) -> str:
        if self.count is not None:
            return str(self.count)
        if self.percent is not None:
            return f"{self.percent:g}%"
        return "none"


def parse_dead_letter_limit(value: str | DeadLetterLimit) -> DeadLetterLimit:
    """`none`, `N` (a count) or `P%` (a percentage of chunks + dead letters)."""
    if isinstance(value, DeadLetterLimit):
        return value
    v = value.strip().lower()
    if v in ("none", ""):
        return DeadLetterLimit()
    m = re.fullmatch(r"(\d+(?:\.\d*)?)%", v)
    if m and float(m.group(1)) <= 100:
        return DeadLetterLimit(percent=float(m.group(1)))
    if v.isdigit():
        return DeadLetterLimit(count=int(v))
    msg = f"expected none, a count N or a percentage P% (0-100), got {value!r}"
    raise argparse.ArgumentTypeError(msg)


def dead_letter_limit_text(value: str) -> str:
    return str(parse_dead_letter_limit(value))
