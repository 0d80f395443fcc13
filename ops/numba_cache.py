"""What Numba's on-disk cache holds for this machine, and a hook on the process's first compile.

    cache_folder()              where the kernels' compiled code is cached (NUMBA_CACHE_DIR, or
                                the package's own __pycache__, or Numba's per-user fallback)
    holds_this_cpu()            whether that cache has kernels compiled for this CPU
    with on_first_compile(callback): ...      callback(qualified name) at the block's first
                                compile in this process (a load from the cache is not one)
    with recording_compiles() as names: ...   the functions compiled while the block ran

Numba keys each cache entry by the signature, the code, and the CPU the code was compiled for
(target triple, CPU name and features): a cache built on another CPU model is valid but holds
nothing this machine can load, so every kernel compiles once per process, as without a cache.
These read Numba's own evidence (its cache index and its `numba:compile` event, which fires only
on a real compile, never on a load from the cache).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from numba.core import event

__all__ = ["cache_folder", "holds_this_cpu", "on_first_compile", "recording_compiles"]


def _probe() -> Any:
    """A dispatcher of the additive kernel (every job and every warm-up calls one), uncompiled."""
    from linstream.ops.additive.numba import _causal_kernel

    return _causal_kernel(1, 1, False)


def cache_folder() -> str:
    """Where the kernels are cached: NUMBA_CACHE_DIR when set (Numba keeps a subfolder per
    source folder in it), else the additive kernel's own cache folder (the other kernels sit
    in their modules' folders beside it)."""
    from numba.core import config

    folder = getattr(config, "CACHE_DIR", "")  # set at import from NUMBA_CACHE_DIR
    return str(folder or _probe()._cache._cache_path)


def holds_this_cpu() -> bool:
    """Whether the cache holds the additive kernel compiled for this CPU (any head width),
    from sources as they are now (Numba drops an index older than its source file)."""
    disp = _probe()
    try:
        index = disp._cache._cache_file._load_index()
    except Exception:  # unreadable: Numba would compile, and so say we
        return False
    magic = disp.targetctx.codegen().magic_tuple()
    return any(key[1] == magic for key in index)


class _Compiles(event.Listener):
    """Numba's compile event, passed to the watchers registered at the time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchers: list[Callable[[str], bool]] = []  # False: remove me

    def on_start(self, ev: event.Event) -> None:
        fn = ev.data["dispatcher"].py_func
        name = f"{fn.__module__}.{fn.__qualname__}"
        with self.lock:
            watchers = list(self.watchers)
        for watcher in watchers:
            if not watcher(name):
                with self.lock, contextlib.suppress(ValueError):
                    self.watchers.remove(watcher)

    def on_end(self, ev: event.Event) -> None:
        pass


_compiles = _Compiles()
event.register("numba:compile", _compiles)


@contextlib.contextmanager
def on_first_compile(callback: Callable[[str], None]) -> Iterator[None]:
    """Inside the block, call `callback(name)` at the first compile in this process (any
    thread), with the qualified name of the function that compiles; at most once."""
    fired = threading.Event()

    def once(name: str) -> bool:
        if not fired.is_set():
            fired.set()
            callback(name)
        return False

    with _compiles.lock:
        _compiles.watchers.append(once)
    try:
        yield
    finally:
        with _compiles.lock, contextlib.suppress(ValueError):
            _compiles.watchers.remove(once)


@contextlib.contextmanager
def recording_compiles() -> Iterator[list[str]]:
    """A list that receives the qualified name of every function compiled (not loaded from the
    cache) in this process, in any thread, while the block runs."""
    names: list[str] = []

    def record(name: str) -> bool:
        names.append(name)
        return True

    with _compiles.lock:
        _compiles.watchers.append(record)
    try:
        yield names
    finally:
        with _compiles.lock, contextlib.suppress(ValueError):
            _compiles.watchers.remove(record)
