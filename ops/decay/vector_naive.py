"""Float64 reference for the vector-gated rule, token by token (a test oracle; slow on purpose).

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ        y_t = S_tᵀ q_t

One log gate per key dimension, token and head (g_t ≤ 0, a vector gate; the scalar `gated` rule
is the case where every key dimension shares one value): Gated Linear Attention's gate, and
HGRN2's forget gate.  No feature map and no normalizer: a model applies its own maps and scale
to q and k before.  Shapes: q, k, log_gate [T, H, d_k]; v [T, H, d_v]; S [H, d_k, d_v].
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["vector_gated_recurrent"]


def vector_gated_recurrent(
    q: Any, k: Any, v: Any, state: Any = None, *, log_gate: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (out [T, H, d_v] float64, the final S [H, d_k, d_v] float64)."""
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    gate = np.exp(np.asarray(log_gate, np.float64))
    t, h, dk = k64.shape
    dv = v64.shape[2]
    s = np.zeros((h, dk, dv)) if state is None else np.array(state, np.float64)
    out = np.empty((t, h, dv))
    for i in range(t):
        s = gate[i][:, :, None] * s + k64[i][:, :, None] * v64[i][:, None, :]
        out[i] = np.einsum("hk,hkv->hv", q64[i], s)
    return out, s
