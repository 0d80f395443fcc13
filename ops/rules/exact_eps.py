"""eps in the unscaled domain for feature maps whose query form rescales each token (FAVOR+).

A map may give queries as q̂_t = exp(-s_t) φ(q_t) (its `query_shift` s_t keeps them in range) and
keys as k̂_t = exp(-b) φ(k_t) (its constant `key_shift` b).  The kernels form num̂ / (den̂ + eps)
with one scalar eps; since num̂ = exp(-s_t - b) num and den̂ = exp(-s_t - b) den, the textbook

    y_t = φ(q_t)ᵀS_t / (φ(q_t)ᵀz_t + eps)  =  num̂_t / (den̂_t + eps · exp(-s_t - b))

needs a per-token eps.  The additive kernels run with eps = 0 (r = num̂/den̂, which is exact) and
`restore_eps` applies y = r · den̂ / (den̂ + eps_t), forming den̂ = q̂ᵀ(z_0 + Σ k̂) in float64.
The rule kernels (ops/rules) take the per-token eps directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.feature_maps import FeatureMap

__all__ = ["eps_per_token", "needs_exact_eps", "premap", "restore_eps"]

# smallest largest-feature of a key that float32 holds to full precision (normal range · 2^24)
_F32_LOW = float(np.finfo(np.float32).tiny) * 2.0**24

# tokens per block when forming the running key sums (bounds the [block, H, F] float64 buffer)
_BLOCK = 1024


def needs_exact_eps(fm: FeatureMap, d_in: int) -> bool:
    """True when the map's query or key forms carry a factor that a scalar eps would not see."""
    probe = np.zeros((1, d_in))
    return fm.query_shift(probe) is not None or fm.key_shift(d_in) != 0.0


def premap(fm: FeatureMap, q: Any, k: Any, cdt: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q̂ [T, H, F], k̂ [T, H, F], log eps factor ℓ [T, H] float64) with eps_t = eps·e^ℓ.

    q̂ and k̂ are in cdt, or in float64 when a float32 key would underflow (see below).
    """
    qf, shift = fm.query_and_shift(np.asarray(q, dtype=cdt), xp=np)
    kf = fm(np.asarray(k, dtype=cdt), xp=np)
    if np.dtype(cdt) == np.float32 and kf.size and not np.all(kf.max(axis=-1) >= _F32_LOW):
        # A key whose largest feature left float32's normal range (its exponent is below
        # B - 147): float32 would lose that key, so this call's chunk math runs in float64.
        return premap(fm, q, k, np.float64)
    t, h = qf.shape[:2]
    log_f = np.full((t, h), -fm.key_shift(int(q.shape[2])), dtype=np.float64)
    if shift is not None:
        log_f -= np.asarray(shift, dtype=np.float64)[..., 0]
    return np.ascontiguousarray(qf, dtype=cdt), np.ascontiguousarray(kf, dtype=cdt), log_f


def eps_per_token(eps: float, log_f: np.ndarray | None, t: int, h: int) -> np.ndarray:
    """eps_t [T, H] float64: eps · exp(ℓ_t) (inf where that overflows: the read is then 0)."""
    if log_f is None or eps == 0:  # (0 · an overflowed factor would be NaN)
        return np.full((t, h), eps, dtype=np.float64)
    with np.errstate(over="ignore"):
        return eps * np.exp(log_f)


def restore_eps(
    ratio: Any, qf: np.ndarray, kf: np.ndarray, z0: Any, eps: float, log_f: np.ndarray
) -> np.ndarray:
    """y = r · den̂ / (den̂ + eps_t) from r = num̂/den̂ (computed with eps = 0), in r's dtype.

    Where den̂ = 0 every feature product is 0, so num̂ = 0 too and y = 0 (r is NaN there).
    """
    r = np.asarray(ratio)
    t, h = r.shape[:2]
    eps_t = eps_per_token(eps, log_f, t, h)
    den = np.empty((t, h), dtype=np.float64)
    run = np.array(np.asarray(z0), dtype=np.float64)  # [H, F]
    for s in range(0, t, _BLOCK):
        e = min(s + _BLOCK, t)
        zc = run[None] + np.cumsum(kf[s:e], axis=0, dtype=np.float64)
        den[s:e] = np.einsum("thf,thf->th", qf[s:e].astype(np.float64), zc)
        run = zc[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        zero = (den == 0)[..., None]
        keep = (den / (den + eps_t))[..., None]
        y = np.where(zero, 0.0, r.astype(np.float64) * keep)  # NaN in, NaN out
    return y.astype(r.dtype, copy=False)
