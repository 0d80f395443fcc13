"""RWKV-7's elementwise steps on a chunk's arrays as fused Numba passes (float32 or float64, rows
to Numba's threads from 2^18 elements on, as `fused`): the token shift, the LoRA activations,
the keys, the per-head norm with its bonus and gate, relu², the LayerNorms.

    shift_mix(h, last, mix)          [M, T, D]: h + (h_{t−1} − h) ⊙ mix_c for each row c of mix
                                     (h_{−1} = last, the previous chunk's last row)
    decay_(x, b)                     x ← −e^{−1/2} · sigmoid(x + b)         (the log decay w)
    sigmoid_(x, b=None)              x ← sigmoid(x + b)
    v_residual(v, v_first, x, b)     v + (v_first − v) · sigmoid(x + b)
    keys(k, α, k_k, k_a, d, fused)   (−k̂, k ⊙ (1 + (α − 1) ⊙ k_a), k̂ ⊙ α): k̂ = k ⊙ k_k normalized
                                     per head of d (fused: / √(Σ + 1e-6), else / max(‖·‖, 1e-12))
    group_norm_out_(o, r, k, v, r_k, g, w, b, eps)
                                     o ← (GroupNorm_head(o) · w + b + (Σ_head r ⊙ k ⊙ r_k) v) ⊙ g
    sqrelu_(x)                       x ← max(x, 0)²
    layer_norm(x, w, b, eps)         (x − mean) / √(var + eps) · w + b per row (b None: none)
    add_layer_norm(x, y, w, b, eps)  (x + y, layer_norm(x + y, ...)) in one pass

A name ending in `_` writes its first argument (a product's fresh output) and returns it; the
others return new arrays.  Means and variances are summed in float64.  sigmoid(x) is
1 / (1 + e^−x) with `linstream.ops.numba_tools.exp` (as `fused`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

from .rwkv7_xp import _L2_EPS, _NORMALIZE_EPS, DECAY_SCALE  # the constants live Numba-free

__all__ = [
    "add_layer_norm",
    "decay_",
    "group_norm_out_",
    "keys",
    "layer_norm",
    "shift_mix",
    "sigmoid_",
    "sqrelu_",
    "v_residual",
]

_WORK_PER_ELEMENT = 16  # as fused.py: a parallel region from 2^18 elements


def _pick(kernels: dict[bool, Any], size: int) -> Any:
    return kernels[worth_threads(size * _WORK_PER_ELEMENT)]


def _variants(make: Any) -> dict[bool, Any]:
    return {p: make(p) for p in (False, True)}


def _shift_mix(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(h, last, mix, out):  # pragma: no cover - compiled
        t, d = h.shape
        for i in prange(t):
            for c in range(mix.shape[0]):
                for j in range(d):
                    x = h[i, j]
                    p = last[j] if i == 0 else h[i - 1, j]
                    out[c, i, j] = x + (p - x) * mix[c, j]

    return run


def _decay(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, b, scale):  # pragma: no cover - compiled
        one = x.dtype.type(1)
        for i in prange(x.shape[0]):
            for j in range(x.shape[1]):
                x[i, j] = scale / (one + exp(-(x[i, j] + b[j])))

    return run


def _v_residual(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(v, v_first, x, b, out):  # pragma: no cover - compiled
        one = v.dtype.type(1)
        for i in prange(v.shape[0]):
            for j in range(v.shape[1]):
                s = one / (one + exp(-(x[i, j] + b[j])))
                out[i, j] = v[i, j] + (v_first[i, j] - v[i, j]) * s

    return run


def _keys(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(k, alpha, k_k, k_a, d, fused, a_out, k_out, b_out):  # pragma: no cover - compiled
        one = k.dtype.type(1)
        for i in prange(k.shape[0]):
            for h0 in range(0, k.shape[1], d):
                ss = 0.0
                for j in range(h0, h0 + d):
                    x = np.float64(k[i, j] * k_k[j])
                    ss += x * x
                if fused:
                    inv = k.dtype.type(1.0 / math.sqrt(ss + _L2_EPS))
                else:
                    inv = k.dtype.type(1.0 / max(math.sqrt(ss), _NORMALIZE_EPS))
                for j in range(h0, h0 + d):
                    kv = k[i, j]
                    al = alpha[i, j]
                    kk = kv * k_k[j] * inv
                    a_out[i, j] = -kk
                    b_out[i, j] = kk * al
                    k_out[i, j] = kv + kv * (al - one) * k_a[j]

    return run


def _group_norm_out(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(o, r, k, v, r_k, g, w, b, eps):  # pragma: no cover - compiled
        t, nh, dv = o.shape
        dk = r.shape[2]
        for i in prange(t):
            for h in range(nh):
                s = 0.0
                for j in range(dv):
                    s += np.float64(o[i, h, j])
                mean = s / dv
                s2 = 0.0
                for j in range(dv):
                    c = np.float64(o[i, h, j]) - mean
                    s2 += c * c
                inv = o.dtype.type(1.0 / math.sqrt(s2 / dv + eps))
                m = o.dtype.type(mean)
                bonus = o.dtype.type(0)
                for j in range(dk):
                    bonus += r[i, h, j] * k[i, h, j] * r_k[h, j]
                for j in range(dv):
                    c = h * dv + j
                    y = (o[i, h, j] - m) * inv * w[c] + b[c] + bonus * v[i, h, j]
                    o[i, h, j] = y * g[i, h, j]

    return run


def _sqrelu(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x):  # pragma: no cover - compiled
        zero = x.dtype.type(0)
        for i in prange(x.shape[0]):
            for j in range(x.shape[1]):
                y = max(x[i, j], zero)
                x[i, j] = y * y

    return run


def _layer_norm(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, y, w, b, eps, add, s_out, out):  # pragma: no cover - compiled
        """out ← LN(x + y) (y read only with add, x + y then written to s_out)."""
        d = x.shape[1]
        for i in prange(x.shape[0]):
            if add:
                for j in range(d):
                    s_out[i, j] = x[i, j] + y[i, j]
                row = s_out[i]
            else:
                row = x[i]
            s = 0.0
            for j in range(d):
                s += np.float64(row[j])
            mean = s / d
            s2 = 0.0
            for j in range(d):
                c = np.float64(row[j]) - mean
                s2 += c * c
            inv = x.dtype.type(1.0 / math.sqrt(s2 / d + eps))
            m = x.dtype.type(mean)
            for j in range(d):
                out[i, j] = (row[j] - m) * inv * w[j] + b[j]

    return run


_SHIFT_MIX = _variants(_shift_mix)
_DECAY = _variants(_decay)
_V_RESIDUAL = _variants(_v_residual)
_KEYS = _variants(_keys)
_GROUP_NORM_OUT = _variants(_group_norm_out)
_SQRELU = _variants(_sqrelu)
_LAYER_NORM = _variants(_layer_norm)


def shift_mix(h: np.ndarray, last: np.ndarray, mix: np.ndarray) -> np.ndarray:
    out = np.empty((mix.shape[0], *h.shape), dtype=h.dtype)
    _pick(_SHIFT_MIX, out.size)(h, last.astype(h.dtype), mix, out)
    return out


def decay_(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    _pick(_DECAY, x.size)(x, b, x.dtype.type(DECAY_SCALE))
    return x


def sigmoid_(x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x ← sigmoid(x + b) (−e^{−1/2}·… for decay_; here the plain sigmoid)."""
    zero = np.zeros(x.shape[1], x.dtype) if b is None else b
    _pick(_DECAY, x.size)(x, zero, x.dtype.type(1))
    return x


def v_residual(v: np.ndarray, v_first: np.ndarray, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty(v.shape, dtype=v.dtype)
    _pick(_V_RESIDUAL, v.size)(v, v_first, x, b, out)
    return out


def keys(
    k: np.ndarray, alpha: np.ndarray, k_k: np.ndarray, k_a: np.ndarray, d: int, fused: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a_out, k_out, b_out = (np.empty(k.shape, dtype=k.dtype) for _ in range(3))
    _pick(_KEYS, k.size * 2)(k, alpha, k_k, k_a, d, fused, a_out, k_out, b_out)
    return a_out, k_out, b_out


def group_norm_out_(
    o: np.ndarray,
    r: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    r_k: np.ndarray,
    g: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    eps: float,
) -> np.ndarray:
    """o, v, g [T, H, d_v]; r, k [T, H, d_k]; r_k [H, d_k]; w, b [H·d_v]."""
    _pick(_GROUP_NORM_OUT, o.size * 2)(o, r, k, v, r_k, g, w, b, eps)
    return o


def sqrelu_(x: np.ndarray) -> np.ndarray:
    _pick(_SQRELU, x.size)(x)
    return x


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    out = np.empty(x.shape, dtype=x.dtype)
    bias = np.zeros(x.shape[1], x.dtype) if b is None else b
    _pick(_LAYER_NORM, x.size)(x, x, w, bias, eps, False, out, out)
    return out


def add_layer_norm(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    s = np.empty(x.shape, dtype=x.dtype)
    out = np.empty(x.shape, dtype=x.dtype)
    bias = np.zeros(x.shape[1], x.dtype) if b is None else b
    _pick(_LAYER_NORM, x.size)(x, y, w, bias, eps, True, s, out)
    return s, out
