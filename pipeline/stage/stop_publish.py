"""A clean stop publishes what its commits cover: when a job is stopped (SIGINT, SIGTERM), the
results of every chunk its checkpoint commits cover are readable in ``<output>/results/`` once it
has exited, instead of waiting in hidden pending files for the next `--resume` to roll them
forward.  Both ways below publish through the output spans' own protocol (spans/writer.py), so the
exactly-once promise holds as after any crash; a later `--resume` finds those spans published.

- Stages in this process (FnApiRunner's in-process workers, Prism's LOOPBACK workers):
  `close_gate()` makes every commit, restore and publish of this process's stages that has not
  started wait (for good: the process is about to exit) and waits for those in flight; then
  `publish_live()` publishes each live stage's open output group, as the end of its bundle
  would (the commits made durable first).
- Worker processes (killed by the stop): `roll_forward(output, checkpoint_dir)` rolls forward,
  from the store, the newest commit of each sequence whose pending files are left in the
  results folder, as the `--resume` that restores the sequence would.  It reads those
  sequences' newest commits (each one's state is checked, as a restore checks it).

No Beam here.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

__all__ = ["close_gate", "gated", "publish_live", "register", "roll_forward"]

F = TypeVar("F", bound=Callable[..., Any])


class _Stage(Protocol):
    """What a stop publishes through: a stage's `Commits` (commits.py)."""

    spans: Any

    def flush(self) -> None: ...


class _Gate:
    """Store work of this process's stages (reentrant per thread) that a stop can hold."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self._closed = False
        self._local = threading.local()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            with self._cond:
                while self._closed:  # a stop: this thread's work waits for the process's exit
                    self._cond.wait()
                self._inside += 1
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._inside -= 1
                    self._cond.notify_all()

    @contextlib.contextmanager
    def passing(self) -> Iterator[None]:
        """This thread goes through the hold (the stop's own publishing)."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth

    def close(self, timeout_s: float) -> bool:
        """No new work starts; True once none is in flight (False: some still was after
        ``timeout_s``)."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._inside == 0, timeout_s)

    @property
    def quiet(self) -> bool:
        with self._cond:
            return self._closed and self._inside == 0


_GATE = _Gate()
_LIVE: weakref.WeakSet[_Stage] = weakref.WeakSet()


def gated(fn: F) -> F:
    """A `Commits` method that writes or reads the store or the output spans: a stop holds it."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with _GATE.entered():
            return fn(*args, **kwargs)

    run.__name__, run.__doc__, run.__qualname__ = fn.__name__, fn.__doc__, fn.__qualname__
    return run  # type: ignore[return-value]


def register(commits: _Stage) -> None:
    """A stage's commits, published by `publish_live` on a stop (held weakly)."""
    _LIVE.add(commits)


def close_gate(timeout_s: float = 30.0) -> bool:
    """A stop: hold every stage of this process before its next commit, restore or publish, and
    wait up to ``timeout_s`` for those in flight; True when none is."""
    return _GATE.close(timeout_s)


def publish_live() -> int:
    """Publish the open output group of every stage of this process (after `close_gate`
    returned True); how many stages had one to publish."""
    if not _GATE.quiet:
        return 0
    published = 0
    with _GATE.passing():  # this thread goes through its own hold
        for commits in list(_LIVE):
            if commits.spans is not None:
                commits.flush()
                published += 1
    return published


def roll_forward(output: str, checkpoint_dir: str) -> int:
    """Roll forward the newest commit of each sequence whose pending files are in
    ``<output>/results`` (stages that were killed); how many sequences' spans are published."""
    from linstream.state import CheckpointError, CheckpointStore

    from .spans import RESULTS_DIR, SpanWriter
    from .spans.group_files import ResultsFolder
    from .spans.names import parse_pending, seq_key

    try:
        names = ResultsFolder(f"{output.rstrip('/')}/{RESULTS_DIR}").names()
    except FileNotFoundError:
        return 0
    keys = {p.key for p in map(parse_pending, names) if p is not None}
    if not keys:
        return 0
    store = CheckpointStore(checkpoint_dir, background_prune=False)
    try:
        spans = SpanWriter(output, per_token=False, store_location=store.location)
        spans.durable, spans.durable_seq = store.sync, store.sync_seq

        def check(m: Any) -> None:  # the span names only files of this job's kind (spans/writer.py)
            if m.history is not None and m.history.outputs is not None:
                spans.check(m.history.outputs, m.seq_id)

        done = 0
        for seq_id in store.sequences():
            if seq_key(seq_id) not in keys:
                continue
            try:
                head = store.head(seq_id, fingerprint=None, check=check)
            except CheckpointError:  # damaged: the resume that restores it reports it
                continue
            span = None if head is None else head.history.outputs
            if head is not None and span is not None:
                done += bool(spans.publish(span, seq_id, head.history.commit))
        return done
    finally:
        store.close()
