"""Float64 reference for Mamba-2's SSD rule, token by token (a test oracle; slow on purpose).

With the time steps s_t = time_steps(dt_t + dt_bias) [T, H] and head h in group g = h // (H/G):

    S_t = e^{s_t·A_h} S_{t−1} + s_t x_t B_tᵀ      S [P, N] per head (x_t [P], B_t [N] of group g)
    y_t = S_t C_t + D_h x_t

which is the gated rule of `linstream.ops.decay.naive` (`gated_recurrent`) with the identity
feature map and no normalization: query C, key B, value s_t·x_t, log gate s_t·A_h; this module
only maps Mamba-2's names and layouts onto it.  Shapes: x [T, H, P]; dt [T, H] raw; a [H] (A,
negative); b, c [T, G, N]; d [H] or [H, P] (None: no skip); state [H, P, N] as transformers'
cache holds it (head_dim before d_state).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.decay.naive import gated_recurrent

from .steps import time_steps

__all__ = ["ssd_recurrent"]


def ssd_recurrent(
    x: Any,
    dt: Any,
    a: Any,
    b: Any,
    c: Any,
    d: Any = None,
    state: Any = None,
    *,
    dt_bias: Any = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (y [T, H, P] float64, the final state [H, P, N] float64)."""
    x = np.asarray(x, np.float64)
    _, h, p = x.shape
    g, n = np.shape(b)[1:]
    bias = np.zeros(h) if dt_bias is None else dt_bias
    step = time_steps(dt, bias, dt_limit)  # [T, H]
    rep = h // g
    q = np.repeat(np.asarray(c, np.float64), rep, axis=1)  # [T, H, N]
    k = np.repeat(np.asarray(b, np.float64), rep, axis=1)
    s0 = np.zeros((h, n, p)) if state is None else np.asarray(state, np.float64).transpose(0, 2, 1)
    log_alpha = step * np.asarray(a, np.float64)[None, :]
    y, st = gated_recurrent(
        q,
        k,
        x * step[:, :, None],
        AttentionState(s0, np.zeros((h, n))),
        log_alpha=log_alpha,
        feature_map="identity",
        normalize=False,
    )
    if d is not None:
        dd = np.asarray(d, np.float64)
        y = y + (dd[:, None] if dd.ndim == 1 else dd) * x
    return y, np.ascontiguousarray(st.S.transpose(0, 2, 1))
