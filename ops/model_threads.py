"""Row ranges of a chunk on helper threads, the caller running whatever no helper took.

    split = row_split(threads=2)         # None for one thread
    split(fn, t)                         # fn(slice) over a partition of range(t), returns when done
                                         # (ranges of >= MIN_ROWS rows, at most one per thread)

The model's per-token work (products, norms, activation) between two attention calls is
independent per row, so a chunk's rows can be split across threads.  The caller queues every
range but its first, runs its own, then takes back each range no helper has started and runs
it too; it waits only for ranges a helper is running.  On a busy machine, where a helper may
not get a core for milliseconds, the chunk then costs what it costs on one thread, never a wait
for a thread that is not running (the stall of a statically partitioned pool: BLAS or OpenMP
threads on a shared 2-vCPU machine ran 64-token chunks up to 10-20x slower).

The helpers are daemon threads shared by every caller of the process (several Beam threads
may embed at once; each runs what the helpers leave), started on first use; a forked child
starts its own.  The work must release the GIL to overlap: NumPy's matrix products and the
`nogil` Numba kernels do; the Python between them is short.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

__all__ = ["row_split"]

# A range shorter than this is not worth a hand-off: on the loaded 2-vCPU machine halves of
# 32-64 rows cost 30-47% more CPU than one pass (each re-packs the whole weight matrix for its
# products, plus the hand-offs), so chunks under 2 × MIN_ROWS tokens run on the caller alone.
MIN_ROWS = 128

_PENDING, _TAKEN = 0, 1


class _Range:
    """One row range: claimed once, by a helper or by the caller; `done` is released after."""

    __slots__ = ("claim_lock", "done", "error", "fn", "rows", "state")

    def __init__(self, fn: Callable[[slice], None], rows: slice) -> None:
        self.fn, self.rows = fn, rows
        self.state = _PENDING
        self.claim_lock = threading.Lock()
        self.done = threading.Lock()
        self.done.acquire()
        self.error: BaseException | None = None

    def claim(self) -> bool:
        with self.claim_lock:
            if self.state != _PENDING:
                return False
            self.state = _TAKEN
            return True

    def run(self) -> None:
        try:
            self.fn(self.rows)
        except BaseException as ex:  # handed to the caller, which raises it
            self.error = ex
        finally:
            self.done.release()


class _Helpers:
    def __init__(self, n: int) -> None:
        self.queue: queue.SimpleQueue[_Range] = queue.SimpleQueue()
        for i in range(n):
            threading.Thread(target=self._work, name=f"linstream-rows-{i}", daemon=True).start()

    def _work(self) -> None:
        while True:
            r = self.queue.get()
            if r.claim():
                r.run()


_lock = threading.Lock()
_helpers: dict[int, _Helpers] = {}


def _forget_helpers() -> None:  # a forked child has none of its parent's threads
    global _lock
    _lock = threading.Lock()
    _helpers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)


def _helpers_for(n: int) -> _Helpers:
    h = _helpers.get(n)
    if h is None:
        with _lock:
            h = _helpers.get(n)
            if h is None:
                h = _helpers[n] = _Helpers(n)
    return h


def row_split(threads: int) -> Callable[[Callable[[slice], None], int], None] | None:
    """A `model_layers.RowSplit` over `threads` threads (the caller and threads - 1 helpers),
    or None for one thread."""
    if threads <= 1:
        return None
    helpers = _helpers_for(threads - 1)

    def split(fn: Callable[[slice], None], t: int) -> None:
        parts = max(1, min(threads, t // MIN_ROWS))
        if parts == 1:
            fn(slice(0, t))
            return
        bounds = [t * i // parts for i in range(parts + 1)]
        ranges = [_Range(fn, slice(bounds[i], bounds[i + 1])) for i in range(1, parts)]
        for r in ranges:
            helpers.queue.put(r)
        try:
            fn(slice(bounds[0], bounds[1]))
        finally:
            for r in ranges:
                if r.claim():
                    r.run()
                r.done.acquire()
        for r in ranges:
            if r.error is not None:
                raise r.error

    return split
