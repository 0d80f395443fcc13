"""What the `linstream` command logs: the levels of linstream's and Beam's loggers for 0, 1 or
2 `-v`, read from the command line before Beam is imported, and the quiet around Beam's import
(its import-time lines and warnings are shown with -v only)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator

__all__ = [
    "JOB_SERVER_LOGGERS",
    "LOGGERS",
    "StderrHandler",
    "quiet_beam",
    "quiet_imports",
    "setup_logging",
    "verbosity",
]

LOGGERS = ("", "linstream", "linstream.progress", "apache_beam", "apache_beam.typehints")


class StderrHandler(logging.Handler):
    """The bare message on whatever `sys.stderr` is at the time (progress lines)."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed stream: nowhere to show it
            print(record.getMessage(), file=sys.stderr, flush=True)


def verbosity(argv: list[str]) -> int:
    """How many -v the command line holds (`-v`, `-vv`, `--verbose`), read before the parser is
    built: building it imports Beam, whose import-time lines depend on it."""
    n = 0
    for a in argv:
        if a == "--":
            break
        if a == "--verbose":
            n += 1
        elif len(a) > 1 and a[0] == "-" and a[1] != "-" and set(a[1:]) == {"v"}:
            n += len(a) - 1
    return n


def setup_logging(verbose: int) -> dict[str, int]:
    """Set the log levels for this command; returns the previous ones (restored at the end, so
    that `main()` called in a process of its own leaves its logging as it found it).

    0: linstream's warnings, the progress lines, errors; Beam says nothing (a failed worker's
    error is the command's one line).  -v: linstream's info lines (each stage's progress) and
    Beam's worker logs (INFO), without its type-hint chatter.  -vv: everything, at DEBUG.
    """
    before = {name: logging.getLogger(name).level for name in LOGGERS}
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("linstream").setLevel(level)
    progress = logging.getLogger("linstream.progress")
    progress.setLevel(logging.INFO)
    beam, hints = logging.getLogger("apache_beam"), logging.getLogger("apache_beam.typehints")
    if verbose >= 2:
        logging.getLogger().setLevel(logging.INFO)
        beam.setLevel(logging.DEBUG)
    elif verbose == 1:
        beam.setLevel(logging.INFO)
        hints.setLevel(logging.WARNING)  # one line per type hint it cannot read: noise
    else:  # the runner logs worker failures with their tracebacks; -v shows them
        beam.setLevel(logging.CRITICAL)
    _quiet_job_servers(verbose <= 0)
    if not any(isinstance(h, StderrHandler) for h in progress.handlers):
        progress.addHandler(StderrHandler())
        progress.propagate = False
    return before


#: Loggers of the job servers Beam starts as processes of their own (Prism): their output is
#: relayed to "PrismJobServer" (a logger outside apache_beam that Beam sets to INFO itself) and
#: their stop, at the process's exit, is a warning of apache_beam.utils.subprocess_server.
JOB_SERVER_LOGGERS = ("PrismJobServer", "apache_beam.utils.subprocess_server")
_JOB_SERVER_SINK = logging.NullHandler()


def _quiet_job_servers(quiet: bool) -> None:
    """Without -v, a job server's lines are not shown, neither while the job runs nor when Beam
    stops the server at the process's exit (after `setup_logging`'s levels are restored: this
    holds for the rest of the process); with -v they are."""
    for name in JOB_SERVER_LOGGERS:
        logger = logging.getLogger(name)
        logger.propagate = not quiet
        if quiet and _JOB_SERVER_SINK not in logger.handlers:
            logger.addHandler(_JOB_SERVER_SINK)  # else Python's last-resort handler prints
        elif not quiet and _JOB_SERVER_SINK in logger.handlers:
            logger.removeHandler(_JOB_SERVER_SINK)


@contextlib.contextmanager
def quiet_imports(verbose: int) -> Iterator[None]:
    """Without -v, what Beam says while it is imported is not shown: it logs to the root logger
    (e.g. "apitools not found ..." where the gcp extra is not installed) and warns, on every
    run, about things the job does not use."""
    if verbose:
        yield
        return
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def quiet_beam(args: argparse.Namespace) -> None:
    """Import Beam (once a command's flags are checked) without its import-time lines, unless
    the command has -v."""
    with quiet_imports(int(getattr(args, "verbose", 0) or 0)):
        import apache_beam  # noqa: F401 - imported here, where its import-time lines are quiet
