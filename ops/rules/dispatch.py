"""Run a non-additive update rule on one chunk: map the features, then call its chunk kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.decay.constants import DEFAULT_RULE_CHUNK
from linstream.ops.decay.numba import decay_chunks
from linstream.ops.delta.numba import delta_chunks
from linstream.ops.feature_maps import FeatureMap

from .exact_eps import eps_per_token, needs_exact_eps, premap
from .gather import heads, map_code
from .params import DECAYING_RULES, RuleInputs

__all__ = ["DEFAULT_RULE_CHUNK", "check_rule_backend", "rule_causal"]


def check_rule_backend(rule: str, backend: str) -> None:
    """The rules have Numba CPU kernels only: "auto" and "numba" run them; others are refused."""
    if backend not in ("auto", "numba"):
        msg = (
            f"rule {rule!r} runs on the Numba CPU kernel only: expected backend 'auto' or "
            f"'numba', got {backend!r}"
        )
        raise ValueError(msg)


def rule_causal(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState,
    *,
    fm: FeatureMap,
    eps: float,
    inputs: RuleInputs,
    chunk_size: int | None,
    cdt: np.dtype,
) -> tuple[np.ndarray, AttentionState]:
    """q, k [T, H, d_k], v [T, H, d_v] checked; state checked (S [H, F, d_v], z [H, F]).

    Returns (out [T, H, d_v] in v's dtype, the new state in the state's dtype).
    """
    t, h, dk = (int(n) for n in q.shape)
    c = DEFAULT_RULE_CHUNK if chunk_size is None else int(chunk_size)
    if c < 1:
        msg = f"chunk_size must be >= 1, got {chunk_size}"
        raise ValueError(msg)
    if inputs.rule in DECAYING_RULES:
        log_f = None
        if needs_exact_eps(fm, dk):
            qf, kf, log_f = premap(fm, q, k, cdt)
            cdt = qf.dtype  # float64 where float32 keys would underflow (premap)
            qh, kh = heads(qf, None, cdt), heads(kf, None, cdt)
        else:
            qh, kh = heads(q, fm, cdt), heads(k, fm, cdt)
        vh = heads(v, None, cdt, ones=True)
        sx = np.empty((h, state.S.shape[1], vh.shape[2]), dtype=state.S.dtype)
        sx[:, :, :-1] = state.S
        sx[:, :, -1] = state.z
        eps_t = eps_per_token(eps, log_f, t, h).T
        out = decay_chunks(
            qh, kh, vh, sx, inputs.log_gate, eps_t, normalize=inputs.normalize, chunk_size=c
        ).transpose(1, 0, 2)
        if not inputs.normalize and log_f is not None:  # the read without a ratio: undo q̂'s factor
            with np.errstate(over="ignore"):
                out = out * np.exp(-log_f)[..., None]
        new = AttentionState(np.ascontiguousarray(sx[:, :, :-1]), sx[:, :, -1].copy())
    else:
        if map_code(fm) < 0:  # textbook query features; keys normalized, so their factor goes
            qh = heads(fm.features(np.asarray(q, dtype=cdt), xp=np), None, cdt)
        else:
            qh = heads(q, fm, cdt)
        kh = heads(k, fm, cdt, unit=True)
        vh = heads(v, None, cdt)
        s = np.array(state.S, copy=True, order="C")
        beta = inputs.beta if inputs.beta is not None else np.ones((h, t))
        out = delta_chunks(qh, kh, vh, s, inputs.log_gate, beta, chunk_size=c).transpose(1, 0, 2)
        new = AttentionState(s, np.array(state.z, copy=True))
    return np.asarray(out).astype(v.dtype, copy=False), new
