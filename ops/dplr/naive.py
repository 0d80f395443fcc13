"""Float64 reference for the generalized delta rule (DPLR form), token by token (a test oracle;
slow on purpose).

    S_t = diag(exp(w_t)) S_{t-1} + b_t (a_tᵀ S_{t-1}) + k_t v_tᵀ        o_t = S_tᵀ q_t

i.e. S_t = (diag(exp(w_t)) + b_t a_tᵀ) S_{t-1} + k_t v_tᵀ with S [H, d_k, d_v] key-major: the
rank-1 term reads the state before this token's decay.  fla writes the same recurrence in
`fla.ops.generalized_delta_rule.dplr.naive.dplr_recurrence` (whose q it scales by d_k^-0.5
itself; here q is taken as given).  RWKV-7 calls it with a = −k̂, b = k̂·α (k̂ its L2-normalized
key, α its in-context learning rate), w = −e^{-1/2}·sigmoid(·).  Shapes: q, k, a, b, log_w
[T, H, d_k]; v [T, H, d_v].
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["dplr_recurrent"]


def dplr_recurrent(
    q: Any, k: Any, v: Any, a: Any, b: Any, log_w: Any, state: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (out [T, H, d_v] float64, the final S [H, d_k, d_v] float64)."""
    q64, k64, v64, a64, b64 = (np.asarray(x, np.float64) for x in (q, k, v, a, b))
    w = np.exp(np.asarray(log_w, np.float64))
    t, h, dk = k64.shape
    dv = v64.shape[2]
    s = np.zeros((h, dk, dv)) if state is None else np.array(state, np.float64)
    out = np.empty((t, h, dv))
    for i in range(t):
        read = np.einsum("hk,hkv->hv", a64[i], s)  # a_tᵀ S_{t-1}
        s = w[i][:, :, None] * s + b64[i][:, :, None] * read[:, None, :]
        s = s + k64[i][:, :, None] * v64[i][:, None, :]
        out[i] = np.einsum("hk,hkv->hv", q64[i], s)
    return out, s
