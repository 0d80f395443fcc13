"""The values the checkpoint store hands out: commit outcomes, commit listings, heads, problems."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from linstream.state.sequence_state import SequenceState

from .manifest import History, Manifest

__all__ = ["NO_HISTORY", "CheckpointProblem", "CommitInfo", "CommitOutcome", "Head"]


class CommitOutcome(enum.StrEnum):
    COMMITTED = "committed"
    DUPLICATE = "duplicate"
    EQUAL_WITHIN_TOLERANCE = "equal_within_tolerance"


@dataclass(frozen=True)
class CommitInfo:
    """One commit as its manifest describes it (``problem`` set when the manifest is unreadable)."""

    seq_id: str | None
    position: int
    manifest_path: str
    data_path: str | None
    size: int | None
    next_chunk: int | None
    fingerprint: str | None
    problem: str | None = None
    commit: int | None = None  # number in the chain (format 2); None for a format-1 commit


#: The history of a format-1 commit, which recorded none.
NO_HISTORY = History(commit=0, parent_position=0, final_chunk=-1, digests=b"")


@dataclass(frozen=True)
class Head:
    """The newest readable commit of a sequence: its state and history, and what was newer but
    could not be read (commits skipped by a fallback, as (path, manifest or None)).
    ``newest_commit`` is the highest commit number in the folder: a writer continuing this head
    creates the number after it (so a fallback never collides with the unreadable commits)."""

    state: SequenceState
    history: History
    manifest_path: str
    skipped: tuple[tuple[str, Manifest | None], ...] = ()
    newest_commit: int = 0


@dataclass(frozen=True)
class CheckpointProblem:
    """A commit that does not pass the restore checks."""

    path: str
    reason: str
    error: str

    def __str__(self) -> str:
        return f"{self.path}: {self.error}: {self.reason}"
