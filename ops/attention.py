"""Public entry points: `causal_linear_attention` (carried state) and `linear_attention`."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from linstream.ops.additive.chunk import DEFAULT_CHUNK_SIZE, chunked_causal
from linstream.ops.rules.exact_eps import needs_exact_eps, premap, restore_eps

from .attention_state import AttentionState
from .backend import resolve_backend
from .checks import check_eps, check_qkv, check_state
from .feature_maps import FeatureMap, Identity, get_feature_map
from .rules import check_rule, check_rule_backend, rule_causal

__all__ = ["causal_linear_attention", "linear_attention"]


def _compute_dtype(q: Any, k: Any, v: Any) -> np.dtype:
    """float32 when every input is float32 (or narrower), float64 otherwise."""
    dt = np.result_type(q.dtype, k.dtype, v.dtype)
    return np.dtype(np.float32) if dt.itemsize <= 4 else np.dtype(np.float64)


def _default_chunk_size(backend: str) -> int:
    """Each backend's measured default chunk size
    (docs/benchmarks.md#causal-linear-attention-kernels)."""
    if backend == "numba":
        from linstream.ops.additive.numba import DEFAULT_CHUNK_SIZE as numba_default

        return int(numba_default)
    return DEFAULT_CHUNK_SIZE


def causal_linear_attention(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState | None = None,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    backend: str = "auto",
    chunk_size: int | None = None,
    state_dtype: npt.DTypeLike | None = None,
    rule: str = "additive",
    gamma: Any = None,
    log_alpha: Any = None,
    beta: Any = None,
    normalize: bool = True,
) -> tuple[Any, AttentionState]:
    """Causal linear attention over one chunk of a sequence, continuing from `state`.

    q, k: [T, H, d_k]; v: [T, H, d_v]; state: AttentionState(S [H, F, d_v], z [H, F]) or None
    for zeros, where F is the feature map's output width (d_k except for FAVOR+).
    Returns (out [T, H, d_v] in v's dtype, the state after the chunk).  Calling it again on the
    next chunk with the returned state gives the same outputs as one call on the whole sequence.
    The state is float64 unless `state_dtype` (or the given state) says float32.  Inputs and
    the given state are never mutated.

    rule: "additive" (default), "decay" (gamma [H] or a number in (0, 1)), "gated" (log_alpha
    [T, H] <= 0), "delta" (beta [T, H] in (0, 1]) or "gated_delta" (log_alpha and beta); see
    docs/rules.md.  normalize=False drops the decaying rules' normalizer; the delta rules read
    y = Sᵀφ(q) and carry z through unchanged.  The rules run on the Numba CPU kernels.
    """
    t, h, dk, dv = check_qkv(q, k, v)
    eps = check_eps(eps)
    rules = check_rule(rule, t, h, gamma=gamma, log_alpha=log_alpha, beta=beta, normalize=normalize)
    fm = get_feature_map(feature_map)
    f = fm.out_dim(dk)
    if state is None:
        sdt = np.dtype(state_dtype if state_dtype is not None else np.float64)
        if sdt.kind != "f":
            msg = f"state_dtype must be float32 or float64, got {sdt}"
            raise TypeError(msg)
        state = AttentionState.zeros(h, f, dv, sdt)
    else:
        check_state(state, h, f, dv)
    if rules.rule != "additive":
        check_rule_backend(rules.rule, backend)
        if t == 0:
            return np.empty((0, h, dv), dtype=v.dtype), state.copy()
        return rule_causal(
            q, k, v, state, fm=fm, eps=eps, inputs=rules, chunk_size=chunk_size,
            cdt=_compute_dtype(q, k, v),
        )  # fmt: skip
    name = resolve_backend(backend)
    if t == 0:
        return np.empty((0, h, dv), dtype=v.dtype), state.copy()
    c = _default_chunk_size(name) if chunk_size is None else int(chunk_size)
    if c < 1:
        msg = f"chunk_size must be >= 1, got {chunk_size}"
        raise ValueError(msg)
    cdt = _compute_dtype(q, k, v)
    # FAVOR+ rescales each query: the kernels run on pre-mapped features with eps = 0 (exact)
    # and eps is applied per token in the unscaled domain afterwards (rules/exact_eps.py); a
    # call whose float32 keys would underflow runs in float64 (premap).
    exact = needs_exact_eps(fm, dk)
    if exact:
        q, k, log_f = premap(fm, q, k, cdt)
        fm, eps_user, eps, cdt = Identity(), eps, 0.0, q.dtype
    if name == "numba":
        from linstream.ops.additive.numba import numba_causal

        out, new = numba_causal(q, k, v, state, feature_map=fm, eps=eps, chunk_size=c, dtype=cdt)
    elif name == "cupy":
        from linstream.ops.additive.cupy import cupy_causal

        out, new = cupy_causal(q, k, v, state, feature_map=fm, eps=eps, chunk_size=c, dtype=cdt)
    else:
        qf = fm.query(np.asarray(q, dtype=cdt), xp=np)
        kf = fm(np.asarray(k, dtype=cdt), xp=np)
        out, new = chunked_causal(
            qf, kf, np.asarray(v, dtype=cdt), state, eps=eps, chunk_size=c, xp=np
        )
    if exact:
        out = restore_eps(out, q, k, state.z, eps_user, log_f)
    return out.astype(v.dtype, copy=False), new


def linear_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    backend: str = "auto",
) -> Any:
    """Non-causal linear attention: every query reads the whole input.

    out = φ(Q)(φ(K)ᵀV) / (φ(Q)(φ(K)ᵀ1) + eps), per head.  q, k: [T, H, d_k]; v: [T, H, d_v].
    """
    _t, _h, _dk, _dv = check_qkv(q, k, v)
    eps = check_eps(eps)
    fm = get_feature_map(feature_map)
    name = resolve_backend(backend)
    if name == "cupy":
        from linstream.ops.additive.cupy import xp_cupy as xp_mod

        xp: Any = xp_mod()
    else:
        xp = np
    cdt = _compute_dtype(q, k, v)
    qf, shift = fm.query_and_shift(xp.asarray(q, dtype=cdt), xp=xp)
    kf = fm(xp.asarray(k, dtype=cdt), xp=xp)
    vv = xp.asarray(v, dtype=cdt)
    kv = xp.einsum("thf,thd->hfd", kf, vv)
    ksum = kf.sum(axis=0)
    num = xp.einsum("thf,hfd->thd", qf, kv)
    den = xp.einsum("thf,hf->th", qf, ksum)
    e: Any = eps
    if shift is not None and eps > 0:  # eps in the unscaled domain (see rules/exact_eps.py)
        with np.errstate(over="ignore"):
            e = eps * xp.exp(-shift[..., 0].astype(np.float64) - fm.key_shift(_dk))
    return (num / (den + e)[..., None]).astype(v.dtype, copy=False)
