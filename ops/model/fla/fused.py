"""Fused Numba passes for the fla runtime's elementwise steps on [T, D] arrays (float32 or
float64, any strides): one pass where NumPy's tanh form of the sigmoid takes four.

    swiglu(gate, up)      silu(gate) · up, a new C-contiguous array
    silu(x)               x · sigmoid(x), a new C-contiguous array

sigmoid(x) = 1 / (1 + e^−x) with `linstream.ops.numba_tools.exp` (the vectorizable float32
polynomial, clamped so e^−x stays finite; libm for float64, where e^−x = inf gives x/inf = −0,
the limit).  Measured on the ~100M-parameter GLA of tests/bench/test_bench_fla.py: the MLP's
SwiGLU over [2048, 2048] took ~0.1 s a layer in NumPy.  Rows go to Numba's threads from 2^18
elements on (`worth_threads`, as the runtime's other kernels).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

__all__ = ["silu", "swiglu"]

_WORK_PER_ELEMENT = 16  # as ops/model/kernels.py: a parallel region from 2^18 elements


def _swiglu_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(g, u, out):  # pragma: no cover - compiled
        one = g.dtype.type(1)
        for i in prange(g.shape[0]):
            for j in range(g.shape[1]):
                x = g[i, j]
                out[i, j] = x * u[i, j] / (one + exp(-x))

    return run


def _silu_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, out):  # pragma: no cover - compiled
        one = x.dtype.type(1)
        for i in prange(x.shape[0]):
            for j in range(x.shape[1]):
                v = x[i, j]
                out[i, j] = v / (one + exp(-v))

    return run


_SWIGLU = {p: _swiglu_kernel(p) for p in (False, True)}
_SILU = {p: _silu_kernel(p) for p in (False, True)}


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) · up for [T, D] arrays of one float dtype."""
    out = np.empty(gate.shape, dtype=gate.dtype)
    _SWIGLU[worth_threads(gate.size * _WORK_PER_ELEMENT)](gate, up, out)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x) for a [T, D] float array."""
    out = np.empty(x.shape, dtype=x.dtype)
    _SILU[worth_threads(x.size * _WORK_PER_ELEMENT)](x, out)
    return out
