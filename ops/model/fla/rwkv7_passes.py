"""RWKV-7's elementwise steps on a chunk's [T, D] arrays, in the compute dtype (float32 or
float64): the token shift, the LoRA activations, the keys, the per-head norm and output gate,
relu².

    shift_mix(h, last, mix)        [h + (h_{t−1} − h) ⊙ mix_c for each row c of mix]; h_{−1}: last
    decay(x, b)                    −e^{−1/2} · sigmoid(x + b)          (the log decay w)
    v_residual(v, v_first, x, b)   v + (v_first − v) · sigmoid(x + b)
    sigmoid_bias(x, b), sigmoid(x)
    keys(k, α, k_k, k_a, d, fused) (k̂, k ⊙ (1 + (α − 1) ⊙ k_a), k̂ ⊙ α) with k̂ = k ⊙ k_k
                                   normalized per head of d (fused: /√(Σ + 1e-6), else
                                   / max(‖·‖, 1e-12))
    group_norm_out(o, r, k, v, r_k, g, w, b, eps)
                                   (GroupNorm_head(o) · w + b + (Σ_head r ⊙ k ⊙ r_k) v) ⊙ g
    sqrelu(x)                      max(x, 0)²

Every function returns new arrays (the inputs are never written).
"""

from __future__ import annotations

import numpy as np

from .pieces import sigmoid

__all__ = [
    "decay",
    "group_norm_out",
    "keys",
    "shift_mix",
    "sigmoid",
    "sigmoid_bias",
    "sqrelu",
    "v_residual",
]

DECAY_SCALE = -0.6065306597126334  # −e^{−1/2}
_L2_EPS = 1e-6  # fla.modules.l2norm (fuse_norm), inside the root
_NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize, a floor on the norm


def shift_mix(h: np.ndarray, last: np.ndarray, mix: np.ndarray) -> list[np.ndarray]:
    """h [T, D], last [D] (the previous chunk's last row), mix [M, D] -> M arrays [T, D]."""
    prev = np.concatenate([last.astype(h.dtype, copy=False)[None], h[:-1]], axis=0)
    delta = prev - h
    return [h + delta * m for m in mix]


def sigmoid_bias(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    return sigmoid(x + b)


def decay(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    return sigmoid(x + b) * x.dtype.type(DECAY_SCALE)


def v_residual(v: np.ndarray, v_first: np.ndarray, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    return v + (v_first - v) * sigmoid(x + b)


def keys(
    k: np.ndarray, alpha: np.ndarray, k_k: np.ndarray, k_a: np.ndarray, d: int, fused: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = k.shape[0]
    kk = (k * k_k).reshape(t, -1, d)
    ss = np.einsum("thd,thd->th", kk, kk)[..., None]
    if fused:
        kk = kk / np.sqrt(ss + _L2_EPS).astype(k.dtype)
    else:
        kk = kk / np.maximum(np.sqrt(ss), _NORMALIZE_EPS).astype(k.dtype)
    kk = kk.reshape(t, -1)
    k_new = k + k * (alpha - 1) * k_a
    return kk, k_new, kk * alpha


def group_norm_out(
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
    """o, v, g [T, H, d_v]; r, k [T, H, d_k]; r_k [H, d_k]; w, b [H·d_v] -> [T, H, d_v]."""
    shape = o.shape
    mean = o.mean(axis=-1, keepdims=True)
    oc = o - mean
    var = (oc * oc).mean(axis=-1, keepdims=True)
    y = oc / np.sqrt(var + eps).astype(o.dtype)
    y = y * w.reshape(shape[1:]) + b.reshape(shape[1:])
    y = y + (r * k * r_k).sum(axis=-1, keepdims=True) * v
    return y * g


def sqrelu(x: np.ndarray) -> np.ndarray:
    y = np.maximum(x, 0)
    return y * y
