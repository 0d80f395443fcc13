"""Mamba-2's passes between its products as array-namespace expressions: `mamba2_passes`'
`conv_silu` and `gated_norm`, taking the namespace `xp` first (NumPy or CuPy: what the device
runtime runs), the same arguments after it, the same results.

    y, tail = conv_silu(xp, xbc, tail, w, bias)     SiLU(bias + depthwise causal conv, width W)
    o = gated_norm(xp, y, z, weight, groups, eps, mode)

The convolution is W shifted multiply-adds over the whole chunk (tail and chunk joined), in
the Numba kernel's order (bias, then tap 0 to W−1); the norm sums each group's squares in
float64 (the squares formed in the compute dtype, as the kernel) and rounds the reciprocal
root to the compute dtype.  SiLU is v / (1 + e^−v) with the namespace's `exp` (the kernel uses
`numba_tools.exp`): a few units of roundoff apart, bounded in
tests/ops/fla/test_fla_xp_passes.py.  Inputs may be strided views (the in-projection's columns).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GATED_NORM_MODES", "conv_silu", "gated_norm", "silu_"]

#: the gated norm's modes, also `mamba2_passes`' (defined here, Numba-free, for both)
GATED_NORM_MODES = ("gate_then_norm", "norm_then_gate", "gate")


def silu_(xp: Any, x: Any) -> Any:
    """x ← x / (1 + e^−x) in place (e^−x overflowing to ∞ gives the exact limit −0)."""
    e = -x
    with np.errstate(over="ignore"):
        xp.exp(e, out=e)
    e += np.dtype(x.dtype).type(1)
    x /= e
    return x


def conv_silu(xp: Any, x: Any, tail: Any, w: Any, bias: Any) -> tuple[Any, Any]:
    """x [T, D] (any strides); tail [W−1, D] (the state's dtype); w [D, W]; bias [D] or None ->
    (y [T, D] in x's dtype, the new tail [W−1, D] in tail's dtype)."""
    t, dd = x.shape
    k = int(w.shape[1]) - 1
    full = xp.concatenate([xp.asarray(tail, dtype=x.dtype), x])  # [W−1+T, D]
    wt = xp.asarray(w, dtype=x.dtype).T
    out = xp.zeros((t, dd), dtype=x.dtype)
    if bias is not None:
        out += xp.asarray(bias, dtype=x.dtype)
    for j in range(k + 1):
        out += wt[j] * full[j : j + t]
    old = xp.asarray(tail)
    joined = xp.concatenate([old, x.astype(old.dtype)])
    new_tail = xp.array(joined[joined.shape[0] - k :], copy=True)
    return silu_(xp, out), new_tail


def gated_norm(xp: Any, y: Any, z: Any, weight: Any, groups: int, eps: float, mode: str) -> Any:
    """The gated RMSNorm of y [T, D] by z [T, D] over `groups` groups (modes as
    `mamba2_passes.gated_norm`); weight [D] (None only for mode "gate"); a new [T, D]."""
    if mode not in GATED_NORM_MODES:
        msg = f"gated_norm: expected a mode of {GATED_NORM_MODES}, got {mode!r}"
        raise ValueError(msg)
    t, dd = y.shape
    out = y * silu_(xp, xp.array(z, copy=True)) if mode != "norm_then_gate" else xp.array(y)
    if mode == "gate":
        return out
    gs = dd // groups
    grouped = out.reshape(t, groups, gs)
    ss = xp.sum(grouped * grouped, axis=-1, keepdims=True, dtype=xp.float64)
    r = (1.0 / xp.sqrt(ss / gs + eps)).astype(out.dtype)
    grouped *= r
    grouped *= xp.asarray(weight, dtype=out.dtype).reshape(groups, gs)
    out = grouped.reshape(t, dd)
    if mode == "norm_then_gate":
        out *= silu_(xp, xp.array(z, copy=True))
    return out
