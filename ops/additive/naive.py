"""Float64 NumPy references, shipped as test oracles.  Slow on purpose: clarity over speed.

    causal_quadratic   the O(T²) masked form (A = tril(φ(Q)φ(K)ᵀ), diagonal included)
    causal_recurrent   token by token: S ← S + φ(k)vᵀ, z ← z + φ(k), then read with φ(q)
    noncausal_quadratic every query reads the whole input: φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)

    rule_recurrent     token by token for every update rule (ops/rules, docs/rules.md)

Queries use the textbook features φ(q) (`textbook_queries`: no per-token rescaling), keys
the map's key form, whose state is exp(-b) times the textbook one (b = `key_shift`, 0 except
for FAVOR+ with large |w|): eps is applied as eps·exp(-b), which is y = φ(q)ᵀS / (φ(q)ᵀz + eps)
with the textbook S and z, for every eps.

Shapes: q, k [T, H, d_k]; v [T, H, d_v]; out [T, H, d_v] float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import FeatureMap, get_feature_map

__all__ = ["causal_quadratic", "causal_recurrent", "noncausal_quadratic", "rule_recurrent"]


def textbook_queries(phi: FeatureMap, q: np.ndarray) -> np.ndarray:
    """φ(q) without a per-token factor: `features` where the map declares one (`query_shift`),
    else its query form (which then carries none, so eps applies to it as it is)."""
    return phi.query(q) if phi.query_shift(q) is None else phi.features(q)


def _mapped(
    q: Any, k: Any, fm: str | FeatureMap, eps: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """(φ(q) textbook, key features, eps in the key form's scale) in float64."""
    phi = get_feature_map(fm)
    q = np.asarray(q, dtype=np.float64)
    return (
        np.asarray(textbook_queries(phi, q), dtype=np.float64),
        np.asarray(phi(np.asarray(k, dtype=np.float64)), dtype=np.float64),
        float(eps) * float(np.exp(-phi.key_shift(int(q.shape[-1])))),
    )


def _initial(state: AttentionState | None, h: int, f: int, dv: int) -> AttentionState:
    if state is None:
        return AttentionState.zeros(h, f, dv)
    return AttentionState(np.array(state.S, np.float64), np.array(state.z, np.float64))


def causal_quadratic(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
) -> tuple[np.ndarray, AttentionState]:
    """O(T²) masked form, starting from `state` (zeros if None)."""
    qf, kf, eps = _mapped(q, k, feature_map, eps)
    v = np.asarray(v, dtype=np.float64)
    t, h, _ = qf.shape
    s0 = _initial(state, h, kf.shape[2], v.shape[2])
    scores = np.einsum("thf,shf->hts", qf, kf) * np.tril(np.ones((t, t)))
    num = np.einsum("thf,hfd->thd", qf, s0.S) + np.einsum("hts,shd->thd", scores, v)
    den = np.einsum("thf,hf->th", qf, s0.z) + scores.sum(axis=2).T
    out = num / (den[..., None] + eps)
    final = AttentionState(s0.S + np.einsum("thf,thd->hfd", kf, v), s0.z + kf.sum(axis=0))
    return out, final


def causal_recurrent(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
) -> tuple[np.ndarray, AttentionState]:
    """Token-by-token recurrence with a float64 state; O(T) memory, the long-sequence oracle."""
    qf, kf, eps = _mapped(q, k, feature_map, eps)
    v = np.asarray(v, dtype=np.float64)
    t, h, _ = qf.shape
    st = _initial(state, h, kf.shape[2], v.shape[2])
    s, z = st.S.copy(), st.z.copy()
    out = np.empty((t, h, v.shape[2]))
    for i in range(t):
        s += kf[i][:, :, None] * v[i][:, None, :]
        z += kf[i]
        num = np.einsum("hf,hfd->hd", qf[i], s)
        den = np.einsum("hf,hf->h", qf[i], z)
        out[i] = num / (den[:, None] + eps)
    return out, AttentionState(s, z)


def noncausal_quadratic(
    q: Any,
    k: Any,
    v: Any,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
) -> np.ndarray:
    """Unmasked O(T²) form: every query attends to every key."""
    qf, kf, eps = _mapped(q, k, feature_map, eps)
    v = np.asarray(v, dtype=np.float64)
    scores = np.einsum("thf,shf->hts", qf, kf)
    num = np.einsum("hts,shd->thd", scores, v)
    den = scores.sum(axis=2).T
    return num / (den[..., None] + eps)


def rule_recurrent(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    rule: str = "additive",
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    gamma: Any = None,
    log_alpha: Any = None,
    beta: Any = None,
    normalize: bool = True,
) -> tuple[np.ndarray, AttentionState]:
    """Token-by-token float64 reference for `causal_linear_attention(..., rule=...)`."""
    from linstream.ops.rules import (
        check_rule,
        decay_recurrent,
        delta_recurrent,
        gated_delta_recurrent,
        gated_recurrent,
    )

    t, h = np.shape(q)[:2]
    check_rule(rule, t, h, gamma=gamma, log_alpha=log_alpha, beta=beta, normalize=normalize)
    fm, nz = feature_map, normalize
    if rule == "decay":
        return decay_recurrent(q, k, v, state, gamma=gamma, feature_map=fm, eps=eps, normalize=nz)
    if rule == "gated":
        la = log_alpha
        return gated_recurrent(q, k, v, state, log_alpha=la, feature_map=fm, eps=eps, normalize=nz)
    if rule == "delta":
        return delta_recurrent(q, k, v, state, beta=beta, feature_map=fm)
    if rule == "gated_delta":
        return gated_delta_recurrent(q, k, v, state, log_alpha=log_alpha, beta=beta, feature_map=fm)
    return causal_recurrent(q, k, v, state, feature_map=fm, eps=eps)
