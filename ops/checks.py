"""Input checks shared by the public entry points: messages say what was expected and what came."""

from __future__ import annotations

from typing import Any

import numpy as np

from .attention_state import AttentionState

__all__ = ["check_eps", "check_qkv", "check_state"]


def _dtype_of(name: str, x: Any) -> np.dtype:
    dt = np.dtype(x.dtype)
    if dt.kind != "f":
        msg = f"{name} must be a floating array (float32 or float64), got dtype {dt}"
        raise TypeError(msg)
    return dt


def check_qkv(q: Any, k: Any, v: Any) -> tuple[int, int, int, int]:
    """Check q, k [T, H, d_k] and v [T, H, d_v]; return (T, H, d_k, d_v)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            msg = f"{name} must be an array of shape [T, H, d], got {type(x).__name__}"
            raise TypeError(msg)
        if len(x.shape) != 3:
            msg = f"{name} must be 3-D [T, H, d], got shape {tuple(x.shape)}"
            raise ValueError(msg)
        _dtype_of(name, x)
    if q.shape != k.shape:
        msg = (
            "q and k must have the same shape [T, H, d_k], "
            f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
        raise ValueError(msg)
    if v.shape[:2] != q.shape[:2]:
        msg = (
            f"v must be [T, H, d_v] with T and H of q, expected [{q.shape[0]}, {q.shape[1]}, d_v], "
            f"got {tuple(v.shape)}"
        )
        raise ValueError(msg)
    t, h, dk = (int(n) for n in q.shape)
    return t, h, dk, int(v.shape[2])


def check_state(state: Any, heads: int, d_k: int, d_v: int) -> None:
    """Check that `state` is an AttentionState of S [H, d_k, d_v] and z [H, d_k], float."""
    if not isinstance(state, AttentionState):
        msg = f"state must be an AttentionState(S, z) or None, got {type(state).__name__}"
        raise TypeError(msg)
    if tuple(state.S.shape) != (heads, d_k, d_v) or tuple(state.z.shape) != (heads, d_k):
        msg = (
            f"state shapes must be S {(heads, d_k, d_v)} and z {(heads, d_k)}, "
            f"got S {tuple(state.S.shape)} and z {tuple(state.z.shape)}"
        )
        raise ValueError(msg)
    for name, x in (("state.S", state.S), ("state.z", state.z)):
        _dtype_of(name, x)
    if state.S.dtype != state.z.dtype:
        msg = f"state.S and state.z must share a dtype, got {state.S.dtype} and {state.z.dtype}"
        raise TypeError(msg)


def check_eps(eps: float) -> float:
    e = float(eps)
    if not np.isfinite(e) or e < 0:
        msg = f"eps must be a finite number >= 0, got {eps!r}"
        raise ValueError(msg)
    return e
