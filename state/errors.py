"""Named errors of the state package; each says which file (or value) and why."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "DivergentStateError",
    "ModelMismatchError",
    "NonFiniteStateError",
    "SupersededError",
    "UnsupportedFormatVersionError",
]


class CheckpointError(Exception):
    """Base of every checkpoint and codec error.  ``path`` is the file concerned, if any."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)

    def at(self, path: str) -> CheckpointError:
        """The same error, naming ``path`` (used when a codec error surfaces in the store)."""
        if self.path is not None:
            return self
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        CheckpointError.__init__(err, self.reason, path=path)
        return err


class CorruptCheckpointError(CheckpointError):
    """Truncated, damaged or inconsistent checkpoint data (or a missing file)."""


class UnsupportedFormatVersionError(CheckpointError):
    """The data was written in a format this reader cannot read."""

    def __init__(
        self, message: str, *, found: int = 0, supported: int = 0, path: str | None = None
    ) -> None:
        self.found = found
        self.supported = supported
        super().__init__(message, path=path)


class ModelMismatchError(CheckpointError):
    """The state belongs to another model (its fingerprint differs from the expected one)."""


class DivergentStateError(CheckpointError):
    """A really different state was committed for a position that is already committed."""


class NonFiniteStateError(CheckpointError, ValueError):
    """A state holds NaN or Inf: it is refused for commit and on decode."""


class SupersededError(DivergentStateError):
    """Another writer advanced the sequence first: the commit number this writer wanted to
    create holds another history (two jobs on one store; the later commit is refused)."""
