"""Stopping a local job cleanly: SIGINT/SIGTERM, worker processes, torn temporary folders.

`run_stoppable(fn)` runs `fn` (the whole Beam run) in a thread that has SIGINT and SIGTERM
blocked, as have every thread and worker process the runner starts from it (a blocked signal
mask is inherited across fork and exec), so only the calling thread sees the signal: no worker
prints a KeyboardInterrupt traceback.  On a signal it runs what `on_stop` registered (cancelling
a remote job whose workers live here; holding the stages of this process before their next
commit: `publish_committed`), kills the job's worker processes (SIGKILL: the checkpoint commit
protocol holds at any kill) and raises `Stopped`; the caller publishes what the commits cover
(`publish_committed`), says how many result rows are readable and how to resume, then leaves
with `os._exit` (the runner's threads are not joined).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = [
    "Stopped",
    "hold_stages",
    "kill_descendants",
    "on_stop",
    "publish_committed",
    "readable_rows",
    "remove_stale_temporaries",
    "run_stoppable",
]

T = TypeVar("T")
_SIGNALS = {signal.SIGINT, signal.SIGTERM}
#: Folders Beam's sinks write before their final move: fileio (`.temp<uuid>`) and the
#: file-based sinks such as WriteToText (`beam-temp-<name>-<uuid>`).
_TEMP_PREFIXES = (".temp", "beam-temp-")


#: What a stop does before it kills the job's processes (`on_stop`), in registration order.
_ON_STOP: list[Callable[[], object]] = []
#: Bound on each of them: a stop never waits longer for a runner that does not answer.
ON_STOP_TIMEOUT_S = 15.0


@contextlib.contextmanager
def on_stop(fn: Callable[[], object]) -> Iterator[None]:
    """While the block runs, a stop (SIGINT/SIGTERM in `run_stoppable`) calls ``fn()`` first,
    at most ON_STOP_TIMEOUT_S, its errors ignored: e.g. cancel the job on a remote runner
    whose workers live in this process and die with it."""
    _ON_STOP.append(fn)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            _ON_STOP.remove(fn)


def _run_stop_hooks() -> int:
    """Runs what `on_stop` registered; how many returned without error in their time."""
    done: list[bool] = []
    for fn in list(_ON_STOP):
        t = threading.Thread(target=_quietly, args=(fn, done), name="linstream-stop", daemon=True)
        t.start()
        t.join(ON_STOP_TIMEOUT_S)
    return len(done)


def _quietly(fn: Callable[[], object], done: list[bool]) -> None:
    with contextlib.suppress(BaseException):
        fn()
        done.append(True)


class Stopped(Exception):
    """The job was stopped by `signum` (SIGINT or SIGTERM)."""

    def __init__(self, signum: int, hooks_done: int = 0) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.hooks_done = hooks_done  # `on_stop` callbacks that completed (e.g. a job cancelled)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, whichever of its threads started them (Linux /proc)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return out


def _descendants(root: int) -> list[int]:
    todo, found = [root], []
    while todo:
        for child in _children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants(pid: int | None = None, *, passes: int = 3, gap_s: float = 0.05) -> int:
    """SIGKILL every process below `pid` (default: this one); returns how many.

    Each process is frozen (SIGSTOP) before any is killed, and killed deepest first: Beam starts
    a multi_processing worker as `sh -c python …` and stops that worker's logging server as soon
    as the shell exits, and a worker still running then prints "Logging client failed … resetting"
    to the terminal the stop's one line goes to. The tree is looked over `passes` times, `gap_s`
    apart: a worker the runner was starting during the first look is killed by a later one."""
    root = os.getpid() if pid is None else pid
    killed: set[int] = set()
    for n in range(passes):
        if n:
            time.sleep(gap_s)
        new = [c for c in _descendants(root) if c not in killed]  # parents before children
        for child in new:
            with contextlib.suppress(OSError):  # already gone
                os.kill(child, signal.SIGSTOP)
        for child in reversed(new):
            killed.add(child)
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
    return len(killed)


@contextlib.contextmanager
def _handlers_set_by_main_thread_only() -> Iterator[None]:
    """While the job runs in its thread, `signal.signal` called from any other thread than the
    main one changes nothing (instead of raising ValueError).  Beam's runners that start their
    own job server (PrismRunner, FlinkRunner, SparkRunner) install a SIGINT handler there to stop
    it; here the main thread handles SIGINT, and the stop kills that server with the job's other
    processes."""
    real = signal.signal

    def guarded(signalnum: Any, handler: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            return real(signalnum, handler)
        return signal.getsignal(signalnum)

    signal.signal = guarded
    try:
        yield
    finally:
        signal.signal = real


def run_stoppable(fn: Callable[[], T], poll_s: float = 0.2) -> T:
    """`fn()` in a signal-blocked thread; raises `Stopped` on SIGINT/SIGTERM (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    with _handlers_set_by_main_thread_only():
        return _run_in_thread(fn, poll_s)


def _run_in_thread(fn: Callable[[], T], poll_s: float) -> T:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as ex:  # handed to the caller's thread
            box["error"] = ex

    got: list[int] = []
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, lambda signum, _frame: got.append(signum))
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        worker = threading.Thread(target=target, name="linstream-job", daemon=True)
        worker.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        while worker.is_alive() and not got:
            worker.join(poll_s)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if got:
        # The runner's threads fail as their workers die; they are stopped, not failing.
        threading.excepthook = lambda _args: None
        done = _run_stop_hooks()
        kill_descendants()
        raise Stopped(got[0], done)
    if "error" in box:
        raise box["error"]
    value: T = box["value"]  # set by target
    return value


def _temp_dirs(output: str, depth: int = 3) -> list[str]:
    found: list[str] = []
    if not os.path.isdir(output):
        return found
    for name in os.listdir(output):
        path = os.path.join(output, name)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        if name.startswith(_TEMP_PREFIXES):
            found.append(path)
        elif depth > 1:
            found.extend(_temp_dirs(path, depth - 1))
    return found


def remove_stale_temporaries(output: str | None, older_than_s: float = 0.0) -> list[str]:
    """Remove the sinks' temporary folders under a local `output` (a stopped job's torn files).

    Returns the removed folders.  Only for one job per output folder: another job running on
    the same folder would lose its temporaries.
    """
    if not output or "://" in output:
        return []
    now = time.time()
    removed = []
    for path in _temp_dirs(output):
        try:
            if now - os.path.getmtime(path) >= older_than_s:
                shutil.rmtree(path)
                removed.append(path)
        except OSError:
            continue
    return removed


def readable_rows(output: str) -> int:
    """Rows a reader gets from ``<output>/results`` (the result files' Parquet footers; hidden
    and temporary files left out), local or a URL."""
    from linstream.pipeline.io.output_record import output_contents, result_rows

    contents = output_contents(output)
    return result_rows(contents, contents.result_files)


def hold_stages() -> None:
    """A stop's first step (an `on_stop` callback): the stateful stages of this process start
    no commit, restore or publish any more, and those in flight end (bounded)."""
    from linstream.pipeline.stage.stop_publish import close_gate

    close_gate(ON_STOP_TIMEOUT_S - 1.0)


def publish_committed(output: str, checkpoint_dir: str) -> None:
    """After a stop: publish what the job's commits cover (the open output groups of this
    process's stages, then, from the store, the newest commit of every sequence whose pending
    files a killed worker process left), so that its results are readable now."""
    from linstream.pipeline.stage.stop_publish import publish_live, roll_forward

    publish_live()
    roll_forward(output, checkpoint_dir)
