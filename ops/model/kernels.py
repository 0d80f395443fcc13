"""Fused Numba kernels for the model runtime's per-token steps on the host (float32 compute).

    ops = NumbaOps(norm_eps)
    xn = ops.norm(x, (w, b))               # layernorm (b given) or rmsnorm (b None), new array
    xn = ops.add_norm(x, r, bias, (w, b))  # x += r (+ bias) in place, then xn = norm(x)
    u = ops.bias_act(u, bias, "gelu_tanh") # u = act(u + bias) in place

Each is one pass over the rows where NumPy takes five to nine (a 64 × 128 layernorm was ~9
array operations of a few microseconds each, more than the matrix product it feeds).  The
norms accumulate the row's mean and variance in float64 and round once to float32; the
residual sum is formed in float32 exactly as NumPy forms it ((x + r) + bias), since it is the
stream every later layer adds to.  `model_layers.XpOps` is the same interface on an array
namespace (NumPy for float64 compute and the "numpy" backend, CuPy on a device): the forward is
written once, against either.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from linstream.ops.numba_tools import FASTMATH, exp_f32, njit_variant, worth_threads
from numba import prange

__all__ = ["NumbaOps"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_ACT_CODES = {"relu": 0, "silu": 1, "gelu_tanh": 2}
_EMPTY = np.zeros(0, np.float32)
# Work per element for `worth_threads`: a kernel splits its rows across Numba's threads from
# 2^18 elements on (about 0.1 ms of work on one core); smaller chunks stay on the calling
# thread (see numba_backend for why a parallel region costs on a busy machine).
_WORK_PER_ELEMENT = 16


def _parallel(a: np.ndarray) -> bool:
    return worth_threads(a.size * _WORK_PER_ELEMENT)


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _norm_row(x, i, w, b, eps, out):  # pragma: no cover - compiled
    """out[i] = layernorm (b non-empty) or rmsnorm of x[i], statistics in float64."""
    d = x.shape[1]
    mean = 0.0
    if b.shape[0]:
        for j in range(d):
            mean += np.float64(x[i, j])
        mean /= d
    ss = 0.0
    for j in range(d):
        y = np.float64(x[i, j]) - mean
        ss += y * y
    r = 1.0 / math.sqrt(ss / d + eps)
    if b.shape[0]:
        for j in range(d):
            out[i, j] = (np.float64(x[i, j]) - mean) * r * w[j] + b[j]
    else:
        for j in range(d):
            out[i, j] = np.float64(x[i, j]) * r * w[j]


@numba.njit(nogil=True, cache=True)
def _residual_row(x, i, r, bias):  # pragma: no cover - compiled
    """x[i] = (x[i] + r[i]) + bias in x's dtype, in NumPy's order (no fast-math reordering)."""
    d = x.shape[1]
    if bias.shape[0]:
        for j in range(d):
            x[i, j] = (x[i, j] + r[i, j]) + bias[j]
    else:
        for j in range(d):
            x[i, j] = x[i, j] + r[i, j]


def _norm_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def norm(x, w, b, eps, out):  # pragma: no cover - compiled
        for i in prange(x.shape[0]):
            _norm_row(x, i, w, b, eps, out)

    return norm


def _add_norm_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def add_norm(x, r, bias, w, b, eps, out):  # pragma: no cover - compiled
        for i in prange(x.shape[0]):
            _residual_row(x, i, r, bias)
            _norm_row(x, i, w, b, eps, out)

    return add_norm


def _bias_act_kernel(parallel: bool) -> Any:
    # error_model="numpy": 1 + exp(.) >= 1 never divides by zero, and the check per division
    # would keep LLVM from vectorizing the loop
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def bias_act(u, bias, code):  # pragma: no cover - compiled
        """u = act(u + bias) in place on a [T, d] float32 array.  silu(x) = x·σ(x);
        gelu_tanh(x) = x/2·(1 + tanh(y)) = x·σ(2y) with y = sqrt(2/π)(x + 0.044715x³)."""
        one = np.float32(1)
        zero = np.float32(0)
        c1 = np.float32(-2.0 * _SQRT_2_OVER_PI)
        c3 = np.float32(-2.0 * _SQRT_2_OVER_PI * 0.044715)
        nb = bias.shape[0]
        for i in prange(u.shape[0]):
            for j in range(u.shape[1]):
                x = u[i, j] + bias[j] if nb else u[i, j]
                if code == 0:
                    u[i, j] = x if x > zero else zero
                elif code == 1:
                    u[i, j] = x / (one + exp_f32(-x))
                else:
                    u[i, j] = x / (one + exp_f32(x * (c1 + c3 * x * x)))

    return bias_act


_NORM = {p: _norm_kernel(p) for p in (False, True)}
_ADD_NORM = {p: _add_norm_kernel(p) for p in (False, True)}
_BIAS_ACT = {p: _bias_act_kernel(p) for p in (False, True)}


def _vec(a: np.ndarray | None) -> np.ndarray:
    return _EMPTY if a is None else a


class NumbaOps:
    """The per-token steps as fused kernels, for C-contiguous float32 host arrays [T, d]."""

    def __init__(self, norm_eps: float) -> None:
        self.eps = float(norm_eps)

    def norm(self, x: np.ndarray, wb: tuple[Any, Any]) -> np.ndarray:
        out = np.empty_like(x)
        _NORM[_parallel(x)](x, wb[0], _vec(wb[1]), self.eps, out)
        return out

    def add_norm(
        self, x: np.ndarray, r: np.ndarray, bias: np.ndarray | None, wb: tuple[Any, Any]
    ) -> np.ndarray:
        out = np.empty_like(x)
        par = _parallel(x)
        _ADD_NORM[par](x, r, _vec(bias), wb[0], _vec(wb[1]), self.eps, out)
        return out

    def bias_act(self, u: np.ndarray, bias: np.ndarray | None, act: str) -> np.ndarray:
        _BIAS_ACT[_parallel(u)](u, _vec(bias), _ACT_CODES[act])
        return u
