"""RWKV-7's elementwise steps as array-namespace expressions: `rwkv7_passes`' passes, taking the
namespace `xp` first (NumPy or CuPy: what the device runtime runs), the same arguments after it,
the same results.

    shift_mix(xp, h, last, mix)          [M, T, D]: h + (h_{t−1} − h) ⊙ mix_c (h_{−1} = last)
    decay_(xp, x, b)                     x ← −e^{−1/2} · sigmoid(x + b)
    sigmoid_(xp, x, b=None)              x ← sigmoid(x + b)
    v_residual(xp, v, v_first, x, b)     v + (v_first − v) · sigmoid(x + b)
    keys(xp, k, α, k_k, k_a, d, fused)   (−k̂, k ⊙ (1 + (α − 1) ⊙ k_a), k̂ ⊙ α)
    group_norm_out_(xp, o, r, k, v, r_k, g, w, b, eps)
    sqrelu_(xp, x)                       x ← max(x, 0)²
    layer_norm(xp, x, w, b, eps)         per row; b None: none
    add_layer_norm(xp, x, y, w, b, eps)  (x + y, layer_norm(x + y, ...))

Each is a few whole-chunk operations (one device launch each), never a loop over tokens.  The
arithmetic follows the Numba pass's order: elementwise steps in the compute dtype, means,
variances and the keys' sums of squares in float64 (`dtype=` of the reduction, the float64
values formed per element), the reciprocal root rounded to the compute dtype.  What differs is
the summation order of the float64 sums (rounding far below the compute dtype's), the bonus
Σ r ⊙ k ⊙ r_k summed by the namespace in the compute dtype, and `exp` (the namespace's, not
`numba_tools.exp`): a few units of roundoff, bounded in tests/ops/fla/test_fla_xp_passes.py.
A name ending in `_` writes its first argument and returns it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "add_layer_norm",
    "decay_",
    "group_norm_out_",
    "keys",
    "layer_norm",
    "shift_mix",
    "sigmoid_",
    "sigmoid_of",
    "sqrelu_",
    "v_residual",
]

DECAY_SCALE = -0.6065306597126334  # −e^{−1/2}
_L2_EPS = 1e-6  # fla.modules.l2norm (fuse_norm), inside the root
_NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize, a floor on the norm


def _scalar(x: Any, v: float) -> Any:
    return np.dtype(x.dtype).type(v)


def _sigmoid_in_place(xp: Any, x: Any, scale: float = 1.0) -> Any:
    """x ← scale / (1 + e^−x) in place (the Numba passes' formula; e^−x overflowing to ∞ for
    very negative x gives the exact limit 0, so NumPy's overflow warning is silenced)."""
    with np.errstate(over="ignore"):
        xp.negative(x, out=x)
        xp.exp(x, out=x)
    x += _scalar(x, 1.0)
    xp.divide(_scalar(x, scale), x, out=x)
    return x


def sigmoid_of(xp: Any, x: Any) -> Any:
    """sigmoid(x) as a new array (x not written)."""
    return _sigmoid_in_place(xp, xp.array(x, copy=True))


def shift_mix(xp: Any, h: Any, last: Any, mix: Any) -> Any:
    """h [T, D]; last [D] (any dtype: the carried state); mix [M, D] -> [M, T, D]."""
    prev = xp.concatenate([xp.asarray(last, dtype=h.dtype)[None], h[:-1]])
    delta = prev - h
    out = xp.multiply(delta[None], mix[:, None, :])
    out += h[None]
    return out


def decay_(xp: Any, x: Any, b: Any) -> Any:
    x += b
    return _sigmoid_in_place(xp, x, DECAY_SCALE)


def sigmoid_(xp: Any, x: Any, b: Any = None) -> Any:
    if b is not None:
        x += b
    return _sigmoid_in_place(xp, x)


def v_residual(xp: Any, v: Any, v_first: Any, x: Any, b: Any) -> Any:
    s = _sigmoid_in_place(xp, x + b)
    s *= v_first - v
    s += v
    return s


def keys(
    xp: Any, k: Any, alpha: Any, k_k: Any, k_a: Any, d: int, fused: bool
) -> tuple[Any, Any, Any]:
    """k, alpha [T, D]; k_k, k_a [D]; heads of d -> (a, k_new, b), each [T, D]."""
    t, dd = k.shape
    kk = k * k_k
    x64 = kk.reshape(t, dd // d, d).astype(xp.float64)
    ss = xp.sum(x64 * x64, axis=-1, keepdims=True)
    root = xp.sqrt(ss + _L2_EPS) if fused else xp.maximum(xp.sqrt(ss), _NORMALIZE_EPS)
    inv = 1.0 / root
    kk = (kk.reshape(t, dd // d, d) * inv.astype(k.dtype)).reshape(t, dd)
    a = -kk
    b = kk * alpha
    k_new = k * (alpha - _scalar(k, 1.0))
    k_new *= k_a
    k_new += k
    return a, k_new, b


def _norm_rows(xp: Any, x: Any, eps: float) -> tuple[Any, Any]:
    """(mean, 1/√(var + eps)) over the last axis, in x's dtype, summed in float64."""
    x64 = x.astype(xp.float64)
    mean = xp.mean(x64, axis=-1, keepdims=True)
    c = x64 - mean
    var = xp.mean(c * c, axis=-1, keepdims=True)
    inv = 1.0 / xp.sqrt(var + eps)
    return mean.astype(x.dtype), inv.astype(x.dtype)


def group_norm_out_(
    xp: Any, o: Any, r: Any, k: Any, v: Any, r_k: Any, g: Any, w: Any, b: Any, eps: float
) -> Any:
    """o, v, g [T, H, d_v]; r, k [T, H, d_k]; r_k [H, d_k]; w, b [H·d_v]."""
    _, nh, dv = o.shape
    mean, inv = _norm_rows(xp, o, eps)
    bonus = xp.sum(r * k * r_k, axis=-1, keepdims=True)
    y = o - mean
    y *= inv
    y *= w.reshape(nh, dv)
    y += b.reshape(nh, dv)
    y += bonus * v
    xp.multiply(y, g, out=o)
    return o


def sqrelu_(xp: Any, x: Any) -> Any:
    xp.maximum(x, _scalar(x, 0.0), out=x)
    xp.multiply(x, x, out=x)
    return x


def layer_norm(xp: Any, x: Any, w: Any, b: Any, eps: float) -> Any:
    mean, inv = _norm_rows(xp, x, eps)
    y = x - mean
    y *= inv
    y *= w
    if b is not None:
        y += b
    return y


def add_layer_norm(xp: Any, x: Any, y: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any]:
    s = x + y
    return s, layer_norm(xp, s, w, b, eps)
