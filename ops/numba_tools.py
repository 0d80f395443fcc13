"""The Numba toolkit every kernel in `linstream.ops` builds on: compile options, the serial or
parallel choice, and a float32 exp that LLVM vectorizes.

    FASTMATH                 fast-math flags that keep NaN and Inf (no nnan/ninf)
    njit_variant(parallel)   numba.njit(cache=True) for one of a kernel's two versions, named apart
    worth_threads(work)      whether a call has enough work to run a kernel's parallel version
    only_version(parallel)   a context in which every kernel runs that version (the warm-up)
    exp(x)                   in jitted code: the vectorizable polynomial for float32, libm for
                             float64 (`math.exp` compiles to a scalar libm call here: no SVML)
    exp_f32(x)               the float32 polynomial itself
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

import llvmlite.ir as llvmir
import numba
import numpy as np
from numba.core import cgutils
from numba.core import types as nbtypes
from numba.extending import intrinsic, overload

# Numba's OpenMP threading layer spin-waits after each parallel region by default; between two
# kernel calls that spinning takes the cores from the model's products and made the model
# runtime 3-6x slower than with the NumPy backend.  Passive waiting must be set before libgomp
# loads (`omp_wait`, which linstream.ops imports first; a user's setting wins), and Numba's layer
# loaded on a libgomp of its own where PyTorch's was loaded before that: here, before any kernel.
from . import omp_wait

omp_wait.bind_numba_openmp()

__all__ = ["FASTMATH", "exp", "exp_f32", "njit_variant", "only_version", "worth_threads"]

# Below this much work, counted in the attention kernel's multiply-adds (about a millisecond on
# one core), a kernel runs on the calling thread: waking the other threads costs more than it
# saves, and on a busy machine a parallel region waits for its slowest thread (the model
# runtime's small chunks).  `worth_threads` is that one decision for every kernel in
# linstream.ops; each caller passes its own work measure, converted with a weight per value
# where it counts values (ops/rules/gather.py, ops/model/kernels.py).
_PARALLEL_MIN_WORK = 1 << 22
# set by `only_version` (per thread and context; None: decide by the work)
_ONLY_VERSION: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "linstream_only_version", default=None
)


def njit_variant(parallel: bool, **options: Any) -> Any:
    """numba.njit(parallel=parallel, cache=True, **options) for one of a kernel's two versions,
    with the version in the function's name.

    Numba's on-disk cache finds a function by module, name and line, and tells entries apart by
    signature, bytecode and closure values, not by compile options: the serial and the parallel
    version built from one closure shared one entry, so whichever compiled first was loaded for
    both (the "parallel" kernel then ran its groups one after the other on one thread)."""

    def wrap(fn: Any) -> Any:
        fn.__qualname__ = f"{fn.__qualname__}.{'parallel' if parallel else 'serial'}"
        return numba.njit(parallel=parallel, cache=True, **options)(fn)

    return wrap


def worth_threads(work: int) -> bool:
    """Whether `work` (multiply-adds, or values times a caller's weight) is enough to run
    a kernel's parallel version rather than its serial one."""
    only = _ONLY_VERSION.get()
    if only is not None:
        return only
    return work >= _PARALLEL_MIN_WORK


@contextlib.contextmanager
def only_version(parallel: bool) -> Iterator[None]:
    """Inside, every kernel that picks its version with `worth_threads` runs its parallel
    (True) or serial (False) version whatever the work, in this thread (and context) only:
    the warm-up compiles both versions on a small input."""
    token = _ONLY_VERSION.set(bool(parallel))
    try:
        yield
    finally:
        _ONLY_VERSION.reset(token)


# no nnan/ninf: NaN and Inf in the inputs must propagate to the outputs
FASTMATH: set[str] = {"nsz", "arcp", "contract", "afn", "reassoc"}


@intrinsic
def _floor_f32(typingctx: Any, x: Any) -> Any:
    """floor of a float32 as a float32 (llvm.floor: one vroundps per vector, unlike math.floor,
    which returns an int64 that AVX2 cannot convert to in vectors)."""
    if x != nbtypes.float32:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fnty = llvmir.FunctionType(llvmir.FloatType(), [llvmir.FloatType()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.floor.f32")
        return builder.call(fn, [args[0]])

    return nbtypes.float32(x), codegen


@intrinsic
def _pow2_f32(typingctx: Any, n: Any) -> Any:
    """2**n as a float32 for an integer-valued float32 n in [-126, 128] (128 gives inf).

    Built in 32-bit integers (fptosi, add, shift, bitcast), which vectorize; Numba's own integer
    arithmetic would widen to int64, which AVX2 cannot convert to or from floats in vectors.
    """
    if n != nbtypes.float32:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i32 = llvmir.IntType(32)
        i = builder.fptosi(args[0], i32)
        i = builder.add(i, llvmir.Constant(i32, 127))
        i = builder.shl(i, llvmir.Constant(i32, 23))
        return builder.bitcast(i, llvmir.FloatType())

    return nbtypes.float32(n), codegen


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def exp_f32(x: Any) -> Any:
    """exp for float32 x (Cephes expf: Cody-Waite reduction + degree-6 polynomial, ~1 ulp).

    Built from vectorizable operations only; x is clamped to [-87.3, 88.7] (exp(-87.3) is the
    smallest normal float32, so the result there is 1.2e-38 instead of a subnormal or 0).
    """
    lo = np.float32(-87.3)
    hi = np.float32(88.7)
    x = lo if x < lo else x  # selects, not min/max: numba's min/max branch on NaN
    x = hi if x > hi else x
    # typingctx is implicit in an intrinsic's call (mypy sees the Python signature)
    n: Any = _floor_f32(  # type: ignore[call-arg]
        x * np.float32(1.44269504088896341) + np.float32(0.5)
    )
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * (r * r) + r + np.float32(1.0)
    scale: Any = _pow2_f32(n)
    return p * scale


def exp(x: float) -> float:
    """exp in x's own precision: the vectorizable polynomial for float32, libm for float64."""
    return math.exp(x)


@overload(exp, jit_options={"nogil": True, "fastmath": FASTMATH})
def _exp_overload(x):  # unannotated: numba compares its signature with the lambdas'
    if x == nbtypes.float32:
        return lambda x: exp_f32(x)
    return lambda x: math.exp(x)
