"""A short chunk's packed products, run on the caller and on helper threads that wait for them
spinning, with no wake-up and no GIL between the hand-off and the product.

    cells = [mkl.Cell(packed, x, j, out), mkl.Group([...]), ...]  # `Packed.rows` calls
    if not run(cells, threads=2):  # False: it declines them (see below), none has run
        split.each(cells)

At a 64-token chunk a product is 0.1-1 ms, and handing half of a layer's products to a pool
thread (`threads.RowSplit`) cost about what it saved: a sleeping thread woke 35-56 µs (median;
210 µs at the 90th percentile) after it was handed work here, and then needed the GIL, which
the caller held.  Here each helper, after its last product, spins on the table of the next
batch for SPIN_SECONDS (then sleeps on an event the caller sets), and runs the products of a
batch itself, in jitted code without the GIL: it calls MKL's packed product (`Packed.task`: the
same function, operands and arguments as `Packed.rows`) through its address.  The caller and
the helpers take the batch's products in order, each one whoever claims it first (an atomic
exchange), so the caller never waits for a helper that has not started, only for a product a
helper is running.  Which thread runs a product does not change its bits.

Measured here (2-vCPU Xeon, the products of a 64-token chunk of GLA and DeltaNet ~110M in
bfloat16, called again): one thread 34 and 55 ms, the pool 26 and 38 ms, these helpers 20 and
30 ms; the models' 64-token chunks 1.07-1.2x faster in bfloat16, GLA 1.16-1.2x in float32.
Long chunks keep the pool: their products take milliseconds, a wake-up is nothing to them,
and a spinning helper would take a core from the Numba kernels that run on two threads between
them (2,048-token chunks ran 0.85-0.95x as fast with it).

`run` declines (returns False) a batch it cannot take: more than CAPACITY products, a cell of
another kind, a chunk of 2 × MIN_ROWS rows or more, another thread's batch running (several Beam
threads may embed at once: the second runs on the pool), LINSTREAM_SPIN_US=0 (no spinning
helpers: the pool for every batch), or where the helpers cannot start (no MKL: then there are
no packed weights either).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numba
import numpy as np
from linstream.ops.model.threads import MIN_ROWS
from linstream.ops.numba_atomics import compare_exchange, load_acquire, spin_pause, store_release
from llvmlite import ir
from numba.core import types
from numba.core.errors import NumbaError
from numba.extending import intrinsic

from . import mkl
from .mkl import Cell, Group

__all__ = ["CAPACITY", "ENV", "SPIN_SECONDS", "disabled", "run"]

#: products per batch at most (a 64-token layer hands off 2-16)
CAPACITY = 256
#: how long a helper spins for the next batch before it sleeps (LINSTREAM_SPIN_US, in µs; 0: no
#: helpers).  A 64-token layer's products come a few hundred µs apart here.
SPIN_SECONDS = 300e-6
ENV = "LINSTREAM_SPIN_US"
_log = logging.getLogger(__name__)

# a task's row: its state, then `Packed.task`'s numbers
_STATE, _FIELDS = 0, 11
_READY, _TAKEN, _DONE = 1, 2, 3  # a row is DONE until a batch makes it READY


# -- the jitted side ---------------------------------------------------------------------------
def _compute_codegen(alpha: bool) -> Any:
    """The code of a call of MKL's packed product at an address: cblas_gemm_bf16bf16f32_compute
    (alpha) or cblas_sgemm_compute; row-major, x not transposed, the weight packed; alpha 1,
    beta 0; the arguments (address, m, n, k, x, its row stride, the buffer, k, out, its row
    stride) as int64."""
    i32, f32, ptr = ir.IntType(32), ir.FloatType(), ir.IntType(8).as_pointer()
    head = [i32] * 6 + ([f32] if alpha else [])
    fnty = ir.FunctionType(ir.VoidType(), [*head, ptr, i32, ptr, i32, f32, ptr, i32])

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        f, m, n, k, a, lda, b, ldb, c, ldc = args
        argv = [ir.Constant(i32, v) for v in (101, 111, 151)]  # row-major, N, packed
        argv += [builder.trunc(v, i32) for v in (m, n, k)]
        argv += [ir.Constant(f32, 1.0)] if alpha else []
        argv += [builder.inttoptr(a, ptr), builder.trunc(lda, i32)]
        argv += [builder.inttoptr(b, ptr), builder.trunc(ldb, i32), ir.Constant(f32, 0.0)]
        argv += [builder.inttoptr(c, ptr), builder.trunc(ldc, i32)]
        builder.call(builder.inttoptr(f, fnty.as_pointer()), argv)
        return context.get_dummy_value()

    return codegen


_SIG = types.void(*([types.int64] * 10))


def _sgemm_typer(typingctx: Any, fn: Any, m: Any, n: Any, k: Any, a: Any, lda: Any, b: Any,
                   ldb: Any, c: Any, ldc: Any) -> Any:  # fmt: skip
    return _SIG, _compute_codegen(alpha=False)


def _bf16_typer(typingctx: Any, fn: Any, m: Any, n: Any, k: Any, a: Any, lda: Any, b: Any,
                  ldb: Any, c: Any, ldc: Any) -> Any:  # fmt: skip
    return _SIG, _compute_codegen(alpha=True)


_sgemm_compute: Any = intrinsic(_sgemm_typer)  # Any to mypy: typingctx is implicit in a call
_bf16_compute: Any = intrinsic(_bf16_typer)


@numba.njit(nogil=True, cache=True)
def _claim_and_run(tasks, n, fns):  # pragma: no cover - jitted
    """Runs each of the first n tasks that is ready and that this thread claims first."""
    state = tasks[:, _STATE]
    for i in range(n):
        if load_acquire(state, i) == _READY and compare_exchange(state, i, _READY, _TAKEN):
            t = tasks[i]
            fn = fns[t[1]]
            if t[1] == 0:
                _sgemm_compute(fn, t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10])
            else:
                _bf16_compute(fn, t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10])
            store_release(state, i, _DONE)


@numba.njit(nogil=True, cache=True)
def _publish(ctrl, tasks, n):  # pragma: no cover - jitted
    """The first n tasks (filled in) ready, the batch counter moved on; returns whether a
    helper may be asleep (ctrl[2:] its flags)."""
    state = tasks[:, _STATE]
    for i in range(n):
        store_release(state, i, _READY)
    store_release(ctrl, 1, n)
    seen = load_acquire(ctrl, 0)
    compare_exchange(ctrl, 0, seen, seen + 1)  # the only writer; and a full barrier
    asleep = 0
    for h in range(2, ctrl.shape[0]):
        asleep += load_acquire(ctrl, h)
    return asleep != 0


@numba.njit(nogil=True, cache=True)
def _finish(tasks, n, fns, spins):  # pragma: no cover - jitted
    """The caller's part: runs what no helper took, then waits (at most `spins` pauses) for
    the products helpers are running; returns whether all n are done."""
    _claim_and_run(tasks, n, fns)
    state = tasks[:, _STATE]
    for i in range(n):
        left = spins
        while load_acquire(state, i) != _DONE:
            if left == 0:
                return False
            left -= 1
            spin_pause()
    return True


@numba.njit(nogil=True, cache=True)
def _serve_batches(ctrl, tasks, fns, me, spins, seen):  # pragma: no cover - jitted
    """A helper: runs each new batch's unclaimed tasks until none comes for `spins` pauses;
    then flags itself asleep (ctrl[2 + me]) and returns the last batch seen, unless one came
    meanwhile."""
    idle = 0
    while True:
        now = load_acquire(ctrl, 0)
        if now != seen:
            seen = now
            _claim_and_run(tasks, load_acquire(ctrl, 1), fns)
            idle = 0
        elif idle < spins:
            idle += 1
            spin_pause()
        else:
            compare_exchange(ctrl, 2 + me, 0, 1)  # a full barrier before the check below
            if load_acquire(ctrl, 0) == seen:
                return seen
            store_release(ctrl, 2 + me, 0)


@numba.njit(nogil=True, cache=True)
def _pauses(n):  # pragma: no cover - jitted
    for _ in range(n):
        spin_pause()


# -- the Python side ---------------------------------------------------------------------------
class _Helpers:
    """The task table and `helpers` threads serving it (started at first use, per process)."""

    def __init__(self, helpers: int, spin_seconds: float) -> None:
        self.ctrl = np.zeros(2 + helpers, np.int64)  # batches published, their tasks, asleep
        self.tasks = np.zeros((CAPACITY, _FIELDS), np.int64)
        self.tasks[:, _STATE] = _DONE
        kinds = (np.float32, "bfloat16")  # a task's kind: 0, 1
        self.fns = np.array([mkl.compute_address(k) for k in kinds], np.int64)
        self.spins = _calibrated(spin_seconds)
        self.lock = threading.Lock()
        self.wake = [threading.Event() for _ in range(helpers)]
        for me in range(helpers):
            name = f"linstream-packed-{me}"
            threading.Thread(target=self._serve, args=(me,), name=name, daemon=True).start()

    def _serve(self, me: int) -> None:
        with mkl.one_thread():
            seen = 0
            while True:
                seen = int(_serve_batches(self.ctrl, self.tasks, self.fns, me, self.spins, seen))
                self.wake[me].wait()
                self.wake[me].clear()
                self.ctrl[2 + me] = 0

    def run(self, tasks: Sequence[tuple[int, ...]]) -> None:
        n = len(tasks)
        self.tasks[:n, 1:] = tasks
        with mkl.one_thread():
            if _publish(self.ctrl, self.tasks, n):
                for me, wake in enumerate(self.wake):
                    if self.ctrl[2 + me]:
                        wake.set()
            while not _finish(self.tasks, n, self.fns, self.spins):
                os.sched_yield()  # a helper running a product has lost its core: let it run


def _calibrated(seconds: float) -> int:
    """How many spin pauses take `seconds` here (timed once)."""
    n = 1 << 14
    _pauses(16)
    t0 = time.perf_counter()
    _pauses(n)
    took = max(time.perf_counter() - t0, 1e-9)
    return max(1, int(n * seconds / took))


_lock = threading.Lock()
_helpers: dict[int, _Helpers | None] = {}  # by helper count; None: cannot run here
_off = False  # `disabled`


def _forget() -> None:  # a forked child has none of its parent's threads
    global _lock
    _lock = threading.Lock()
    _helpers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _spin_seconds() -> float:
    raw = os.environ.get(ENV)
    if raw is None:
        return SPIN_SECONDS
    try:
        us = float(raw)
    except ValueError:
        us = -1.0
    if not us >= 0:  # also NaN
        _log.warning(
            "%s=%r: expected microseconds (a number; 0 for no spinning helpers); spinning %g µs",
            ENV, raw, SPIN_SECONDS * 1e6,
        )  # fmt: skip
        return SPIN_SECONDS
    return us * 1e-6


def _for(helpers: int) -> _Helpers | None:
    if helpers not in _helpers:
        with _lock:
            if helpers not in _helpers:
                seconds = _spin_seconds()
                h = None
                try:
                    if seconds > 0:
                        h = _Helpers(helpers, seconds)
                except (mkl.MKLUnavailable, NumbaError):
                    h = None
                _helpers[helpers] = h
    return _helpers[helpers]


def _tasks(
    calls: Sequence[Callable[[], None]],
) -> tuple[list[tuple[int, ...]], list[Cell]] | None:
    """The calls' MKL tasks and the cells that make no MKL call (empty products, which
    `Packed.rows` handles itself), or None where the batch is not for the helpers."""
    cells: list[Cell] = []
    for c in calls:
        if isinstance(c, Cell):
            cells.append(c)
        elif isinstance(c, Group):
            for g in c.cells:  # another engine's calls: not the helpers'
                if not isinstance(g, Cell):
                    return None
                cells.append(g)
        else:
            return None
    if len(cells) > CAPACITY or any(c.x.shape[0] >= 2 * MIN_ROWS for c in cells):
        return None
    tasks, empty = [], []
    for c in cells:
        task = c.packed.task(c.x, c.j, c.out)
        if task is None:
            empty.append(c)
        else:
            tasks.append(task)
    return tasks, empty


def run(calls: Sequence[Callable[[], None]], threads: int) -> bool:
    """Runs `calls` (each a Cell or a Group) on this thread and threads - 1 spinning helpers;
    False, having run none of them, where it declines (see the module docstring)."""
    if threads < 2 or _off:
        return False
    planned = _tasks(calls)
    if planned is None:
        return False
    h = _for(threads - 1)
    if h is None or not h.lock.acquire(blocking=False):
        return False
    tasks, empty = planned
    try:
        if tasks:
            h.run(tasks)
    finally:
        h.lock.release()
    for cell in empty:
        cell()
    return True


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """No spinning helpers inside (every batch to the pool), on every thread: for comparisons."""
    global _off
    saved, _off = _off, True
    try:
        yield
    finally:
        _off = saved
