"""float32 → bfloat16 rounding (to nearest, ties to even) in one Numba pass: the bfloat16
mode's products round their input x once per input (`bf16.Engine.prepare`).

    b = to_bf16(x)        # x [T, D] float32 -> [T, D] ml_dtypes.bfloat16, the same values as
                          # np.array(x, dtype=bfloat16)

A float32's bits u round to the top 16 bits of u + 0x7FFF + (bit 16 of u): the carry of the low
half past 0x8000 (or exactly 0x8000 with an odd bit 16) rounds up, anything less truncates; a
finite value too large for bfloat16 carries into the exponent and becomes inf, as it should.  A
NaN keeps its sign and top mantissa bits with the quiet bit set (the sum could carry a NaN's
mantissa into the sign).  NumPy's conversion through ml_dtypes went at ~0.5 ns a value here,
which was 7-18% of the ~110M models' bfloat16 products (the input of each of a layer's five
projections rounded again); this pass runs at about the rate of the memory it moves, on
Numba's threads from 2^16 values on (`worth_threads`, as the runtime's other passes).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from linstream.ops.numba_tools import njit_variant, worth_threads
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

__all__ = ["bf16_bits", "to_bf16", "written"]

BF16 = np.dtype(ml_dtypes.bfloat16)  # as `bf16.BF16` (which imports this module lazily)
_WORK_PER_VALUE = 4  # a parallel region from 2^16 values (the rounding is a few integer ops)


def _bits_typer(typingctx: Any, v: Any) -> Any:
    """A float32's bits as a uint32 (a bitcast, which vectorizes)."""
    if v != types.float32:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(v), codegen


_bits: Any = intrinsic(_bits_typer)  # Any to mypy: typingctx is implicit in a call


@njit(nogil=True, inline="always")
def bf16_bits(v: Any) -> Any:  # pragma: no cover - compiled
    """A float32 value rounded to bfloat16 (to nearest, ties to even; a NaN quiet), as the
    uint16 of its bits: the one rounding of every pass that writes bfloat16."""
    b = _bits(v)
    if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN: quiet, no carry
        return np.uint16((b >> np.uint32(16)) | np.uint32(0x40))
    up = np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))
    return np.uint16((b + up) >> np.uint32(16))


def written(out: Any, v: Any) -> Any:
    """v as the array `out` holds it: `bf16_bits(v)` where out is uint16 (bfloat16's bits),
    v itself otherwise.  A pass that writes float32 or bfloat16 is then one kernel, compiled
    per output dtype, the float32 version's code unchanged by the other."""
    return v


@overload(written, jit_options={"nogil": True})
def _written_overload(out, v):  # unannotated: numba compares its signature with the lambdas'
    if isinstance(out, types.Array) and out.dtype == types.uint16:
        return lambda out, v: bf16_bits(v)
    return lambda out, v: v


def _round_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True)
    def run(x, out):  # pragma: no cover - compiled
        for i in prange(x.shape[0]):
            for j in range(x.shape[1]):
                out[i, j] = bf16_bits(x[i, j])

    return run


_ROUND = {p: _round_kernel(p) for p in (False, True)}


def to_bf16(x: np.ndarray) -> np.ndarray:
    """x (float32, any shape) rounded to bfloat16, a new C-contiguous array of x's shape;
    anything else (another dtype) through NumPy's conversion."""
    if x.dtype != np.float32:
        return np.array(x, dtype=BF16, order="C")
    x = np.ascontiguousarray(x)
    u = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)
    out = np.empty(u.shape, np.uint16)
    _ROUND[worth_threads(u.size * _WORK_PER_VALUE)](u, out)
    return out.view(BF16).reshape(x.shape)
