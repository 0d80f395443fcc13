"""Float64 references for the delta rules, token by token (test oracles; slow on purpose).

    delta        S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}ᵀk_t)ᵀ                  (DeltaNet)
    gated_delta  S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ          (Gated DeltaNet)
    y_t = S_tᵀ φ(q_t)    (no normalizer: z is carried through unchanged)

k_t = φ(k_t)/‖φ(k_t)‖ (L2-normalized feature-mapped keys; a zero key stays zero), φ(q_t) the
textbook query features.  Written as the formulas read, with explicit outer products.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import FeatureMap, get_feature_map

__all__ = ["delta_recurrent", "gated_delta_recurrent", "unit_keys"]


def unit_keys(kf: Any) -> np.ndarray:
    """φ(k)/‖φ(k)‖ over the last axis in float64; rows with ‖φ(k)‖ = 0 stay 0, a NaN stays NaN
    (as in the kernels: NaN and Inf propagate)."""
    kf = np.asarray(kf, np.float64)
    n = np.sqrt(np.sum(kf * kf, axis=-1, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n == 0, 0.0, kf / n)


def gated_delta_recurrent(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    log_alpha: Any,
    beta: Any,
    feature_map: str | FeatureMap = "elu+1",
) -> tuple[np.ndarray, AttentionState]:
    """The gated delta rule with α_t = exp(log_alpha[t, h]); returns (out float64, state)."""
    fm = get_feature_map(feature_map)
    qf = np.asarray(fm.features(np.asarray(q, np.float64)), np.float64)
    kf = unit_keys(fm(np.asarray(k, np.float64)))
    v = np.asarray(v, np.float64)
    alpha = np.exp(np.asarray(log_alpha, np.float64))
    b = np.asarray(beta, np.float64)
    t, h, f = kf.shape
    dv = v.shape[2]
    if state is None:
        s, z = np.zeros((h, f, dv)), np.zeros((h, f))
    else:
        s, z = np.array(state.S, np.float64), np.array(state.z, np.float64)
    out = np.empty((t, h, dv))
    eye = np.eye(f)
    for i in range(t):
        for j in range(h):
            kk = np.outer(kf[i, j], kf[i, j])
            s[j] = alpha[i, j] * (eye - b[i, j] * kk) @ s[j] + b[i, j] * np.outer(kf[i, j], v[i, j])
            out[i, j] = s[j].T @ qf[i, j]
    return out, AttentionState(s, z)


def delta_recurrent(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    beta: Any,
    feature_map: str | FeatureMap = "elu+1",
) -> tuple[np.ndarray, AttentionState]:
    """The delta rule: the gated one with α_t = 1."""
    t, h = np.shape(q)[:2]
    return gated_delta_recurrent(
        q, k, v, state, log_alpha=np.zeros((t, h)), beta=beta, feature_map=feature_map
    )
