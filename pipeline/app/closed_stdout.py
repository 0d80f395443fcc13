"""A reader that closes the command's standard output early (`linstream … | head -1`) ends its
output, not the command.

    with tolerate_closed_stdout():
        ...  # print freely

Inside the block sys.stdout is a thin wrapper: the first write or flush that finds the pipe's
reader gone (BrokenPipeError) points the file descriptor at os.devnull and drops the rest of
the output quietly, so the command runs to its end and exits with its own status (no traceback,
no "Broken pipe" error line, no error at interpreter shutdown).  Python ignores SIGPIPE, so the
conventional death by that signal (status 141 in a shell) does not happen either.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO, cast

__all__ = ["tolerate_closed_stdout"]


class _ClosedTolerant:
    """Forwards to `stream`; a write or flush to a closed reader is dropped from then on."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_reader = False

    def _drop(self) -> None:
        self.closed_reader = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(fd, self._stream.fileno())  # the buffered rest goes nowhere, quietly
            finally:
                os.close(fd)

    def write(self, text: str) -> int:
        if not self.closed_reader:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.closed_reader:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def tolerate_closed_stdout() -> Iterator[None]:
    """Within the block, output to a reader that went away is dropped (see the module)."""
    before = sys.stdout
    wrapper = _ClosedTolerant(before)
    sys.stdout = cast(TextIO, wrapper)
    try:
        yield
    finally:
        wrapper.flush()  # what is still buffered, while a closed reader is still tolerated
        sys.stdout = before
