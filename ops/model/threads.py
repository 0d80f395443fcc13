"""Row ranges of a chunk on helper threads, the caller running whatever no helper took.

    split = row_split(threads=2)         # None for one thread
    split(fn, t)                         # fn(slice) over a partition of range(t), returns when done
                                         # (ranges of >= MIN_ROWS rows, at most one per thread)
    limit_threads(4)                     # the process's kernels, BLAS and row split: 4 threads

The model's per-token work (products, norms, activation) between two attention calls is
independent per row, so a chunk's rows can be split across threads.  The caller queues every
range but its first, runs its own, then takes back each range no helper has started and runs
it too; it waits only for ranges a helper is running.  On a busy machine, where a helper may
not get a core for milliseconds, the chunk then costs what it costs on one thread, never a wait
for a thread that is not running (the stall of a statically partitioned pool: BLAS or OpenMP
threads on a shared 2-vCPU machine ran 64-token chunks up to 10-20x slower).

The helpers are one `concurrent.futures.ThreadPoolExecutor` per thread count, shared by every
caller of the process (several Beam threads may embed at once; each runs what the helpers
leave), started on first use; a forked child starts its own.  Taking a range back is
cancelling its future, which succeeds only while no helper has started it.  The work must
release the GIL to overlap: NumPy's matrix products and the `nogil` Numba kernels do; the
Python between them is short.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

__all__ = ["limit_threads", "row_split", "thread_counts"]

#: What each library reads, when it loads, for its thread count (Numba's pool; OpenMP, OpenBLAS
#: and MKL's BLAS): set by `limit_threads` for this process and the worker processes it starts.
_THREAD_VARIABLES = (
    "NUMBA_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)

# A range shorter than this is not worth a hand-off: on the loaded 2-vCPU machine halves of
# 32-64 rows cost 30-47% more CPU than one pass (each re-packs the whole weight matrix for its
# products, plus the hand-offs), so chunks under 2 × MIN_ROWS tokens run on the caller alone.
MIN_ROWS = 128

_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _forget_pools() -> None:  # a forked child has none of its parent's threads
    global _lock
    _lock = threading.Lock()
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _pool_for(n: int) -> ThreadPoolExecutor:
    pool = _pools.get(n)
    if pool is None:
        with _lock:
            pool = _pools.get(n)
            if pool is None:
                pool = _pools[n] = ThreadPoolExecutor(n, thread_name_prefix="linstream-rows")
    return pool


def row_split(threads: int) -> Callable[[Callable[[slice], None], int], None] | None:
    """A `model_layers.RowSplit` over `threads` threads (the caller and threads - 1 helpers),
    or None for one thread."""
    if threads <= 1:
        return None
    pool = _pool_for(threads - 1)

    def split(fn: Callable[[slice], None], t: int) -> None:
        parts = max(1, min(threads, t // MIN_ROWS))
        if parts == 1:
            fn(slice(0, t))
            return
        bounds = [t * i // parts for i in range(parts + 1)]
        rows = [slice(bounds[i], bounds[i + 1]) for i in range(1, parts)]
        handed: list[Future[None]] = [pool.submit(fn, r) for r in rows]
        try:
            fn(slice(bounds[0], bounds[1]))
        finally:
            # A range no helper has started is taken back (cancelled) and run here; only a
            # range a helper is running is waited for.
            mine = [r for r, f in zip(rows, handed, strict=True) if f.cancel()]
            for r in mine:
                fn(r)
            # Not `wait(handed)`: a cancelled future counts as done only once a helper has
            # dequeued it, so that would wait for a busy helper after all.
            wait([f for f in handed if not f.cancelled()])
        for f in handed:
            if not f.cancelled():
                f.result()  # raises the range's error

    return split


def limit_threads(n: int) -> None:
    """Bound this process's compute threads to ``n``, as llama.cpp's ``-t`` and PyTorch's
    ``torch.set_num_threads`` do: Numba's pool (the kernels' ``prange`` loops), BLAS's (NumPy's
    matrix products, through threadpoolctl) and the model runtime's row split (as many threads
    as BLAS has).  Worker processes started afterwards inherit it (the environment variables
    each library reads when it loads).  Numba sizes its pool when it is first imported: call
    this before anything loads a model (once Numba is imported, only the calling thread's share
    can still be bounded)."""
    if n < 1:
        msg = f"threads: expected a whole number >= 1, got {n!r}"
        raise ValueError(msg)
    for name in _THREAD_VARIABLES:
        os.environ[name] = str(n)
    if "numba" in sys.modules:
        import numba

        pool = int(getattr(numba.config, "NUMBA_NUM_THREADS", n))  # its size, set at import
        numba.set_num_threads(min(n, pool))
    if "numpy" in sys.modules:  # its BLAS is loaded: bound it now (else the variables do)
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")


def thread_counts() -> tuple[int, int]:
    """(Numba's threads, BLAS's threads) in this process, as the libraries report them."""
    import numba
    from threadpoolctl import threadpool_info

    blas = [int(lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas"]
    return int(numba.get_num_threads()), max([1, *blas])
