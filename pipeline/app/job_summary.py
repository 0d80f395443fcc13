"""What a local run of the embed job did, in the lines `linstream embed` ends with: its counters
(`JobSummary`), and whether its dead letters break the exit-status rule (`dead_letter_verdict`).
No Beam here."""

from __future__ import annotations

from dataclasses import dataclass, field

from .flag_values import DeadLetterLimit, parse_dead_letter_limit

__all__ = [
    "EXIT_DEAD_LETTERS",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "JobSummary",
    "dead_letter_verdict",
]

#: The `linstream` command's exit statuses (and 128 + the signal's number when stopped).
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_DEAD_LETTERS = 0, 1, 2, 3


@dataclass
class JobSummary:
    """What one local run did: wall time and the `linstream` counters."""

    wall_s: float
    counters: dict[str, int] = field(default_factory=dict)
    kernel_time_s: float = 0.0
    #: rows of the result files the job added under ``<output>/results/`` (None: not counted)
    rows_written: int | None = None

    @property
    def tokens(self) -> int:
        return self.counters.get("tokens", 0)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def dead_letters(self) -> int:
        return self.counters.get("dead_letters", 0)

    def dead_letter_reasons(self) -> dict[str, int]:
        """{reason: count} from the `dead_letters.<reason>` counters, largest first."""
        prefix = "dead_letters."
        found = {k[len(prefix) :]: v for k, v in self.counters.items() if k.startswith(prefix)}
        return dict(sorted(((k, v) for k, v in found.items() if v), key=lambda kv: (-kv[1], kv[0])))

    def dead_letter_line(self) -> str:
        """`dead letters: 3 (bad_tokens 2, restore_failed 1)` or `dead letters: none`."""
        if not self.dead_letters:
            return "dead letters: none"
        reasons = ", ".join(f"{k} {v:,}" for k, v in self.dead_letter_reasons().items())
        return f"dead letters: {self.dead_letters:,}" + (f" ({reasons})" if reasons else "")

    def line(self) -> str:
        c = self.counters
        return (
            f"{c.get('chunks', 0):,} chunks, {self.tokens:,} tokens in {self.wall_s:.1f} s "
            f"({self.tokens_per_s:,.0f} tokens/s); duplicates {c.get('duplicates', 0)}, "
            f"buffered {c.get('buffered', 0)}, gaps {c.get('gaps', 0)}, "
            f"dead letters {c.get('dead_letters', 0)}, commits {c.get('commits', 0)}, "
            f"restores {c.get('restores', 0)}"
        )


def dead_letter_verdict(
    summary: JobSummary, limit: DeadLetterLimit | str | None = None
) -> str | None:
    """Why the job must exit 3 (a sentence), or None.

    The rule: any `restore_failed` dead letter (a sequence's checkpoint could not be read, so
    none of its chunks was embedded); a job whose chunks all went to the dead letters (none
    applied, none skipped as applied before: a resumed job with nothing left to do is fine); or
    more dead letters than `--max-dead-letters` (N, or P% of the chunks the job met: applied,
    skipped as applied before, and dead letters).
    """
    if isinstance(limit, str):
        limit = parse_dead_letter_limit(limit)
    c = summary.counters
    dead = summary.dead_letters
    # A chunk skipped as already applied (a resume, a resent chunk) is a chunk done, not dead.
    chunks = c.get("chunks", 0) + c.get("duplicates", 0) + c.get("duplicates_unchecked", 0)
    restore_failed = summary.counters.get("dead_letters.restore_failed", 0)
    if restore_failed:
        return (
            f"{restore_failed:,} chunk(s) went to the dead letters as restore_failed: their "
            "sequences' checkpoints could not be read (see `linstream checkpoint verify`; "
            "--restore-fallback continues from an older commit)"
        )
    if dead and not chunks:
        return f"all {dead:,} input chunk(s) or row(s) went to the dead letters; none was embedded"
    if limit is not None and limit.exceeded(dead, chunks):
        return f"{dead:,} dead letter(s) exceed --max-dead-letters {limit}"
    return None
