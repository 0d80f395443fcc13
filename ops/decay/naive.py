"""Float64 references for the decaying rules, token by token (test oracles; slow on purpose).

    decay   S_t = γ S_{t-1} + φ(k_t)v_tᵀ,    z_t = γ z_{t-1} + φ(k_t)             (RetNet)
    gated   S_t = α_t S_{t-1} + φ(k_t)v_tᵀ,  z_t = α_t z_{t-1} + φ(k_t)           (GLA, Mamba-2)
    y_t = φ(q_t)ᵀS_t / (φ(q_t)ᵀz_t + eps)  with normalize=True,  y_t = φ(q_t)ᵀS_t  without.

Queries use the textbook features (`FeatureMap.features`); keys use the map's key form, so the
state is the one the kernels carry (for FAVOR+ exp(-b) times the textbook one, and eps is
applied as eps·exp(-b): the same y).  Shapes: q, k [T, H, d_k]; v [T, H, d_v]; gamma [H];
log_alpha [T, H].
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import FeatureMap, get_feature_map

__all__ = ["decay_recurrent", "gated_recurrent"]


def gated_recurrent(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    log_alpha: Any,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    normalize: bool = True,
) -> tuple[np.ndarray, AttentionState]:
    """The gated rule with α_t = exp(log_alpha[t, h]); returns (out float64, final state)."""
    fm = get_feature_map(feature_map)
    q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
    qf = np.asarray(fm.query(q64) if fm.query_shift(q64) is None else fm.features(q64), np.float64)
    kf = np.asarray(fm(k64), np.float64)
    scale = np.exp(fm.key_shift(q64.shape[2]))  # textbook S = scale · carried S
    v = np.asarray(v, np.float64)
    alpha = np.exp(np.asarray(log_alpha, np.float64))
    t, h, f = kf.shape
    if state is None:
        s, z = np.zeros((h, f, v.shape[2])), np.zeros((h, f))
    else:
        s, z = np.array(state.S, np.float64), np.array(state.z, np.float64)
    out = np.empty((t, h, v.shape[2]))
    for i in range(t):
        a = alpha[i][:, None]
        s = a[:, :, None] * s + kf[i][:, :, None] * v[i][:, None, :]
        z = a * z + kf[i]
        num = np.einsum("hf,hfd->hd", qf[i], s) * scale
        if normalize:
            den = np.einsum("hf,hf->h", qf[i], z) * scale
            out[i] = num / (den[:, None] + eps)
        else:
            out[i] = num
    return out, AttentionState(s, z)


def decay_recurrent(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    gamma: Any,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    normalize: bool = True,
) -> tuple[np.ndarray, AttentionState]:
    """The decay rule with a fixed γ per head: the gated rule with log α_t = log γ."""
    t, h = np.shape(q)[:2]
    g = np.broadcast_to(np.asarray(gamma, np.float64), (h,))
    log_alpha = np.broadcast_to(np.log(g), (t, h))
    return gated_recurrent(
        q, k, v, state, log_alpha=log_alpha, feature_map=feature_map, eps=eps, normalize=normalize
    )
