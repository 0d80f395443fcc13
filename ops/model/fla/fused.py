"""Fused Numba passes for the fla runtime's elementwise steps on [T, D] arrays (float32 or
float64, any strides): one pass where NumPy's tanh form of the sigmoid takes four.

    swiglu(gate, up)      silu(gate) · up, a new C-contiguous array
    silu(x)               x · sigmoid(x), a new C-contiguous array
    short_conv(x, tail, w, silu)   the depthwise causal convolution of `pieces.short_conv`

sigmoid(x) = 1 / (1 + e^−x) with `linstream.ops.numba_tools.exp` (the vectorizable float32
polynomial, clamped so e^−x stays finite; libm for float64, where e^−x = inf gives x/inf = −0,
the limit).  Measured on the ~100M-parameter GLA of tests/bench/test_bench_fla.py: the MLP's
SwiGLU over [2048, 2048] took ~0.1 s a layer in NumPy; on DeltaNet ~110M the short convolutions
(three per layer, [2048, 768] each, width 4, then SiLU) took as long as the recurrence in NumPy
(a pass per tap, a concatenation, four passes for SiLU), 13x less as one pass here.  Rows go to
Numba's threads from 2^18 elements on (`worth_threads`, as the runtime's other kernels); every
output element is computed on its own, so the bits do not depend on the threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

__all__ = ["short_conv", "silu", "swiglu"]

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


def _conv_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, head, wt, silu, out):  # pragma: no cover - compiled
        # out[t] = Σ_j wt[j] · x[t + j − (W−1)], rows before the chunk read from head [W−1, D]
        n = wt.shape[0] - 1
        one = x.dtype.type(1)
        for t in prange(x.shape[0]):
            row = out[t]
            for d in range(x.shape[1]):
                row[d] = x.dtype.type(0)
            for j in range(n + 1):
                s = t + j - n
                src = x[s] if s >= 0 else head[n + s]
                wj = wt[j]
                for d in range(x.shape[1]):
                    row[d] += wj[d] * src[d]
            if silu:
                for d in range(x.shape[1]):
                    v = row[d]
                    row[d] = v / (one + exp(-v))

    return run


_SWIGLU = {p: _swiglu_kernel(p) for p in (False, True)}
_SILU = {p: _silu_kernel(p) for p in (False, True)}
_CONV = {p: _conv_kernel(p) for p in (False, True)}


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


def short_conv(
    x: np.ndarray, tail: np.ndarray, w: np.ndarray, silu_after: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`pieces.short_conv` in one pass: x [T, D] (float32 or float64), tail [W−1, D] (any
    float dtype), w [D, W]; returns (y [T, D] in x's dtype, the new tail in tail's dtype)."""
    n = w.shape[1] - 1
    head = np.ascontiguousarray(tail, dtype=x.dtype)
    wt = np.ascontiguousarray(w.T, dtype=x.dtype)
    out = np.empty(x.shape, dtype=x.dtype)
    _CONV[worth_threads(x.size * (n + 1) * 4)](x, head, wt, bool(silu_after), out)
    t = x.shape[0]
    if t >= n:
        new_tail = np.array(x[t - n :], dtype=tail.dtype)
    else:
        new_tail = np.concatenate([head[t:], x], axis=0).astype(tail.dtype)  # as pieces'
    return out, new_tail
