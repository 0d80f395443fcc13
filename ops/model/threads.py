"""Row ranges of a chunk, fixed by its length alone, run on the caller and helper threads.

    row_ranges(t)                        # the ranges of a chunk of t rows (t alone decides them)
    split = row_split(threads=2)         # runs them on `threads` threads (1: on the caller)
    split(fn, t)                         # fn(slice) for each of row_ranges(t), returns when done
    split.each([call, ...])              # independent calls, one hand-off for all of them

The model's per-token work (products, norms, activation) between two attention calls is
independent per row, so a chunk's rows can be split across threads.  A product over a range of
rows is not bit-equal to the same rows of a product over all of them (BLAS kernels treat a
block's tail rows, and each thread's share, differently), so the ranges never depend on the
number of threads: one range below 2 × MIN_ROWS rows, two up to 2 × RANGE_ROWS, and 2^k ranges
of at least RANGE_ROWS rows beyond; with BLAS at one thread (`blas`), the bits of a forward are
the same on one thread or many, whoever runs which range.  The caller and the helpers take the
next range nobody has taken until none is left; the caller then takes back the helpers' turns
that have not started and waits only for a helper that is running a range.  On a busy machine,
where a helper may not get a core for milliseconds, the chunk then costs what it costs on one
thread, never a wait for a thread that is not running (the stall of a statically partitioned
pool: BLAS or OpenMP threads on a shared 2-vCPU machine ran 64-token chunks up to 10-20x
slower).

The helpers are one `concurrent.futures.ThreadPoolExecutor` per thread count, shared by every
caller of the process (several Beam threads may embed at once; each runs what the helpers
leave), started on first use; a forked child starts its own.  (A short chunk's packed products
go to the spinning helpers of `linstream.ops.model.fla.packed_batch` instead, where it takes
them.)  Taking a range back is
cancelling its future, which succeeds only while no helper has started it.  The work must
release the GIL to overlap: NumPy's matrix products and the `nogil` Numba kernels do; the
Python between them is short.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

__all__ = ["RANGE_ROWS", "RowSplit", "row_ranges", "row_split"]

# A range shorter than this is not worth a hand-off: on the loaded 2-vCPU machine halves of
# 32-64 rows cost 30-47% more CPU than one pass (each re-packs the whole weight matrix for its
# products, plus the hand-offs), so chunks under 2 × MIN_ROWS tokens are one range.
MIN_ROWS = 128
# Beyond two ranges, each has at least this many rows: measured on one thread here, products of
# the models' shapes over ranges of 128 rows cost 10-25% more than one call over 2,048, ranges
# of 512 or more about the same; a power of two keeps 2, 4, 8 threads evenly loaded.
RANGE_ROWS = 1024

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


def row_ranges(t: int) -> list[slice]:
    """The ranges of a chunk of t rows, in order: one below 2 × MIN_ROWS, else the most of
    2, 4, 8, ... that leaves each at least RANGE_ROWS rows (2 at least), of equal lengths ±1."""
    if t < 2 * MIN_ROWS:
        return [slice(0, t)]
    parts = 2
    while 2 * parts * RANGE_ROWS <= t:
        parts *= 2
    bounds = [t * i // parts for i in range(parts + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts)]


class RowSplit:
    """Runs `row_ranges` (or any list of independent calls) on the caller and threads - 1
    helpers (one thread: the caller alone, in order)."""

    __slots__ = ("_pool", "threads")

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool = _pool_for(threads - 1) if threads > 1 else None

    def __call__(self, fn: Callable[[slice], None], t: int) -> None:
        """fn(r) for each r of row_ranges(t); returns when all are done."""
        self.each([functools.partial(fn, r) for r in row_ranges(t)])

    def each(self, calls: Sequence[Callable[[], None]]) -> None:
        """Each call once, in order of taking (put the longest first), one hand-off for all;
        returns when all are done, raising the first error."""
        pool = self._pool
        if pool is None or len(calls) == 1:
            for call in calls:
                call()
            return
        lock = threading.Lock()
        taken = 0

        def work() -> None:  # take the next call nobody has taken, until none is left
            nonlocal taken
            while True:
                with lock:
                    i, taken = taken, taken + 1
                if i >= len(calls):
                    return
                calls[i]()

        turns: list[Future[None]] = [
            pool.submit(work) for _ in range(min(self.threads, len(calls)) - 1)
        ]
        try:
            work()
        finally:
            # A helper's turn that has not started is taken back (cancelled: the caller has run
            # its calls); only a helper running a call is waited for.  Not `wait(turns)`: a
            # cancelled future counts as done only once a helper has dequeued it.
            running = [f for f in turns if not f.cancel()]
            wait(running)
        for f in running:
            f.result()  # raises the call's error


def row_split(threads: int) -> RowSplit:
    """A `model_layers.RowSplit` running `row_ranges` on `threads` threads (the caller and
    threads - 1 helpers; one thread: the caller alone, in order)."""
    return RowSplit(threads)
