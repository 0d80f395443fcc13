"""Input paths that are not regular files: a FIFO, a socket or a device.

Opening a FIFO for reading waits for a writer, possibly forever, and a device may never end, so
the readers ask `not_a_regular_file` first and turn such a path into one ``unreadable_file``
dead letter naming it instead of opening it.
"""

from __future__ import annotations

import os
import stat

__all__ = ["not_a_regular_file", "special_file_message"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def not_a_regular_file(path: str) -> str | None:
    """What the local ``path`` is when it is not a regular file (links followed), else None.

    URLs of object stores (``gs://``, ``s3://``, ...) name objects, never special files: None.
    A path that cannot be looked at is None too: opening it reports the error.
    """
    if "://" in path and not path.startswith("file://"):
        return None
    try:
        mode = os.stat(path.removeprefix("file://")).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def special_file_message(kind: str) -> str:
    """The reason given for a path that `not_a_regular_file` describes as ``kind``."""
    return f"expected a regular file, found {kind}; not opened (reading it could block)"
