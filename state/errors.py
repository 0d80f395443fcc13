"""Named errors of the state package; each says which file (or value) and why."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "DivergentStateError",
    "ModelMismatchError",
    "NonFiniteStateError",
    "NotARegularFileError",
    "ShapeMismatchError",
    "StateBoundsError",
    "SupersededError",
    "UnsafePathError",
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
    """The state belongs to another model (its fingerprint differs from the expected one).
    ``expected`` and ``found`` are the two fingerprints, whole."""

    def __init__(
        self, message: str, *, expected: str = "", found: str = "", path: str | None = None
    ) -> None:
        self.expected = expected
        self.found = found
        super().__init__(message, path=path)


class DivergentStateError(CheckpointError):
    """A really different state was committed for a position that is already committed."""


class NonFiniteStateError(CheckpointError, ValueError):
    """A state holds NaN or Inf: it is refused for commit and on decode."""


class NotARegularFileError(CorruptCheckpointError):
    """A manifest or data file name that holds a directory, FIFO, device or socket (never opened
    for reading: a FIFO would block)."""


class UnsafePathError(CheckpointError):
    """A symbolic link (or other indirection) inside the store: the store writes none, so it is
    never followed, for reads, writes or deletes."""


class StateBoundsError(CorruptCheckpointError):
    """A state file whose Arrow buffers claim more bytes than its declared shape and dtype allow
    (e.g. a compressed body that would decompress to gigabytes); refused before allocating."""


class ShapeMismatchError(CorruptCheckpointError):
    """A well-formed state whose shape (layers, heads, features, d_v) is not the model's (a
    commit the model cannot continue: with a fallback, an older commit is tried)."""


class SupersededError(DivergentStateError):
    """Another writer advanced the sequence first: the commit number this writer wanted to
    create holds another history (two jobs on one store; the later commit is refused)."""
