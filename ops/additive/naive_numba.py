"""A fast float64 recurrent oracle for very long sequences (Numba), for precision tests.

`causal_recurrent` in reference.py is the clear one but runs in Python per token; over 2^25
tokens that takes hours.  This is the same recurrence, token by token, every operation in
float64 (inputs are upcast, φ in float64 with libm exp, no chunking, no reassociation):

    S ← S + φ(k_t) v_tᵀ,  z ← z + φ(k_t),  y_t = φ(q_t)ᵀS / (φ(q_t)ᵀz + eps)

Its own rounding error grows at most like n·2⁻⁵³ per sum (≈4e-9 relative after 2^25 additions
in the worst case, ≈1e-12 typically), three orders of magnitude below the 1e-6 it checks.
Only the fixed maps (elu+1, relu, identity) are compiled in.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import EluPlusOne, FeatureMap, Identity, Relu, get_feature_map

__all__ = ["recurrent_float64"]


@numba.njit(cache=True, nogil=True)
def _phi64(x: float, fmap: int) -> float:
    if fmap == 2:
        return x + 1.0 if x > 0.0 else math.exp(x)
    if fmap == 1:
        return x if x > 0.0 else 0.0
    return x


@numba.njit(cache=True, nogil=True)
def _recurrent(q, k, v, s, z, out, fmap, eps):  # pragma: no cover - compiled
    t, nh, d = q.shape
    dv = v.shape[2]
    qf = np.empty(d)
    for h in range(nh):
        for i in range(t):
            for f in range(d):
                kf = _phi64(np.float64(k[i, h, f]), fmap)
                z[h, f] += kf
                for e in range(dv):
                    s[h, f, e] += kf * np.float64(v[i, h, e])
                qf[f] = _phi64(np.float64(q[i, h, f]), fmap)
            den = 0.0
            for f in range(d):
                den += qf[f] * z[h, f]
            for e in range(dv):
                acc = 0.0
                for f in range(d):
                    acc += qf[f] * s[h, f, e]
                out[i, h, e] = acc / (den + eps)


def recurrent_float64(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
) -> tuple[np.ndarray, AttentionState]:
    """Token-by-token float64 recurrence; out [T, H, d_v] float64 and the float64 state."""
    fm = get_feature_map(feature_map)
    codes = {EluPlusOne: 2, Relu: 1, Identity: 0}
    if type(fm) not in codes:
        msg = f"recurrent_float64 supports elu+1, relu and identity, got {fm.name!r}"
        raise ValueError(msg)
    t, h, d = q.shape
    dv = v.shape[2]
    if state is None:
        s, z = np.zeros((h, d, dv)), np.zeros((h, d))
    else:
        s, z = np.array(state.S, np.float64), np.array(state.z, np.float64)
    out = np.empty((t, h, dv))
    _recurrent(
        np.ascontiguousarray(q),
        np.ascontiguousarray(k),
        np.ascontiguousarray(v),
        s,
        z,
        out,
        codes[type(fm)],
        float(eps),
    )
    return out, AttentionState(s, z)
