"""The model runtime's BLAS thread layout: held at one thread while a chunk's products run.

    blas, split = _thread_layout()             # BLAS at one thread, and the rows of a chunk in
    with blas: ...                             # ranges fixed by its length (`threads.row_split`)

threadpoolctl finds the process's BLAS libraries once (NumPy's, and the one Numba's kernels call
through SciPy); a limit is shared by every caller thread (set by the first in, restored by the
last out).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from collections.abc import Iterator
from typing import Any

__all__: list[str] = []  # private to the model runtime


@functools.cache
def _blas_libraries() -> tuple[Any, ...]:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process (found once),
    SciPy's among them: Numba's compiled np.dot calls it, and it loads only when a kernel
    first runs, after this search unless it is loaded first here."""
    from threadpoolctl import ThreadpoolController

    with contextlib.suppress(ImportError):
        importlib.import_module("scipy.linalg.cython_blas")
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


def _set_threads(lib: Any, n: int) -> None:
    """Set a BLAS library's thread count from this thread, and release threadpoolctl's
    per-library "controlling thread" (where it has one) so that any thread can set it next."""
    lib.set_num_threads(n)
    release = getattr(type(lib), "clear_controlling_thread", None)
    if release is not None:
        release(force=True)


class _SingleThreadedBlas:
    """Holds the process's BLAS at one thread while any caller is inside; callers on several
    threads share one limit (set by the first in, restored by the last out).

    Each library's count is read and set through its threadpoolctl controller directly (a few
    microseconds; `ThreadpoolController.limit` re-reads every library's info, ~20 µs a chunk),
    and a library already at one thread is left alone.  threadpoolctl (3.8) lets only one
    "controlling" Python thread change a pthreads OpenBLAS and ignores the others, so after
    each change the control is released: the last caller out may be another thread than the
    first one in (both run under this object's lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._restore: list[tuple[Any, int]] = []
        self._threads: int | None = None

    def threads(self) -> int:
        """How many threads the process's BLAS runs when nobody holds it at one (read once)."""
        if self._threads is None:
            with self._lock:
                counts = [n for _, n in self._restore] if self._inside else []
                if not self._inside:
                    counts = [int(lib.get_num_threads()) for lib in _blas_libraries()]
                self._threads = max([1, *counts])
        return self._threads

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                for lib in _blas_libraries():
                    n = int(lib.get_num_threads())
                    if n != 1:
                        _set_threads(lib, 1)
                        self._restore.append((lib, n))
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    for lib, n in self._restore:
                        _set_threads(lib, n)
                    self._restore.clear()


_single_threaded_blas = _SingleThreadedBlas()


def _thread_layout() -> tuple[contextlib.AbstractContextManager[None], Any]:
    """(BLAS held at one thread, the row split) for a forward on the host.

    BLAS runs on one thread for every chunk, and the rows of a chunk of at least
    2 × threads.MIN_ROWS tokens run in ranges fixed by its length (`threads.row_ranges`) on the
    runtime's own threads, as many as BLAS had (the caller runs what no helper took, so a busy
    core costs time, never a stall).  The bits are then those of the ranges, whatever the
    thread count: one BLAS call over all rows, or BLAS's own threads, round differently.
    Measured on the shared 2-vCPU machine (docs/benchmarks.md#the-thread-layout-on-2-threads):
    BLAS's own two threads ran 64-2048-token chunks 2-8x slower than one thread when the second
    core was busy (a statically partitioned pool waits for its slowest thread); on a quiet
    machine one thread alone reached only 1.94x the twin's two threads at 256 tokens."""
    from .heap import keep_heap
    from .threads import row_split

    keep_heap()  # once a process: the chunk's large temporaries reuse the heap (heap.py)
    return _single_threaded_blas(), row_split(_single_threaded_blas.threads())
