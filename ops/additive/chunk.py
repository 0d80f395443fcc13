"""Chunkwise causal linear attention written against an array namespace (NumPy or CuPy).

For a chunk of C tokens with Q̃ = φ(Q), K̃ = φ(K) and A = tril(Q̃K̃ᵀ) (diagonal included):

    numerator = Q̃S + AV,  denominator = Q̃z + A1,  y = numerator / (denominator + eps)
    S ← S + K̃ᵀV,         z ← z + K̃ᵀ1

z is folded into S as an extra value column (V gets a column of ones), so one batched matmul per
term serves numerator and denominator.  Chunk math runs in the inputs' dtype; the chunk's
contribution is added to the state in the state's dtype (float64 by default).
"""

from __future__ import annotations

from typing import Any

from linstream.ops.attention_state import AttentionState

__all__ = ["DEFAULT_CHUNK_SIZE", "chunked_causal"]

DEFAULT_CHUNK_SIZE = 64


def chunked_causal(
    qf: Any,
    kf: Any,
    v: Any,
    state: AttentionState,
    *,
    eps: float,
    chunk_size: int,
    xp: Any,
) -> tuple[Any, AttentionState]:
    """qf, kf: [T, H, F] already feature-mapped; v: [T, H, d_v]; all of one compute dtype.

    Returns (out [T, H, d_v] in the compute dtype, the new state in the state's dtype).
    """
    t, h, f = qf.shape
    dv = v.shape[2]
    cdt = qf.dtype
    sdt = state.S.dtype
    # Head-major copies: [H, T, F] and V extended with ones: [H, T, d_v + 1].
    qh = xp.ascontiguousarray(qf.transpose(1, 0, 2))
    kh = xp.ascontiguousarray(kf.transpose(1, 0, 2))
    vx = xp.empty((h, t, dv + 1), dtype=cdt)
    vx[:, :, :dv] = v.transpose(1, 0, 2)
    vx[:, :, dv] = 1
    sx = xp.empty((h, f, dv + 1), dtype=sdt)
    sx[:, :, :dv] = state.S
    sx[:, :, dv] = state.z
    out = xp.empty((h, t, dv), dtype=cdt)
    c = max(1, int(chunk_size))
    mask = xp.tril(xp.ones((c, c), dtype=cdt))
    for s in range(0, t, c):
        e = min(s + c, t)
        n = e - s
        qc, kc, vc = qh[:, s:e], kh[:, s:e], vx[:, s:e]
        a = xp.matmul(qc, kc.transpose(0, 2, 1)) * mask[:n, :n]
        nd = xp.matmul(qc, sx.astype(cdt)) + xp.matmul(a, vc)
        out[:, s:e] = nd[:, :, :dv] / (nd[:, :, dv:] + eps)
        sx += xp.matmul(kc.transpose(0, 2, 1), vc).astype(sdt)
    new_state = AttentionState(
        xp.ascontiguousarray(sx[:, :, :dv]), xp.ascontiguousarray(sx[:, :, dv])
    )
    return out.transpose(1, 0, 2), new_state
