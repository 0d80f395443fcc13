"""The update rules in PyTorch, chunkwise, for the twin (`model_torch`): autograd runs through them.

Shapes are heads-first: q, k [B, H, T, F]; v [B, H, T, d_v]; per-token log gates and β [B, H, T];
states S [B, H, F, d_v], z [B, H, F].  Inside a chunk of n tokens from the state (S_0, z_0), with
G_i = Σ_{j<=i} log α_j (the cumulative log gate; log γ for `decay`, 0 for `delta`) and
D_ij = exp(G_i - G_j) for j <= i (0 above the diagonal):

decay, gated (`decaying_attention`):

    num = (QKᵀ ⊙ D) V + e^{G} ⊙ Q S_0          den = (QKᵀ ⊙ D) 1 + e^{G} ⊙ Q z_0
    y = num / (den + eps)    (normalize)       y = num                    (normalize=False)
    S_n = e^{G_n} S_0 + (e^{G_n - G} ⊙ K)ᵀ V   z_n = e^{G_n} z_0 + (e^{G_n - G} ⊙ K)ᵀ 1

delta, gated_delta (`delta_attention`, the WY / UT form; k unit keys):

    (I + L) U = B V - B e^{G} ⊙ K S_0,  L_ij = β_i e^{G_i - G_j} (k_i·k_j) for j < i
    y = e^{G} ⊙ Q S_0 + (QKᵀ ⊙ D) U             S_n = e^{G_n} S_0 + (e^{G_n - G} ⊙ K)ᵀ U

solved by forward substitution (`torch.linalg.solve_triangular`, unit diagonal).  Every exponent
is <= 0 (masked entries are exp(-inf) = 0 before the exponential is taken), as in the Numba
kernels (ops/rules, docs/rules.md).  Chunk math runs in q's dtype; each chunk's contribution is
added to the state in the state's dtype.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["decaying_attention", "delta_attention", "unit_keys"]


def unit_keys(k: torch.Tensor) -> torch.Tensor:
    """k / ‖k‖ over the last axis; rows with ‖k‖ = 0 stay 0 (with finite gradients)."""
    n2 = (k * k).sum(-1, keepdim=True)
    safe = torch.where(n2 > 0, n2, torch.ones_like(n2))
    return k * torch.rsqrt(safe)


def _decays(g: torch.Tensor, strict: bool) -> torch.Tensor:
    """exp(G_i - G_j) for j <= i (j < i when strict), 0 elsewhere: [B, H, n, n]."""
    n = g.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=g.device).tril(-1 if strict else 0)
    diff = g[..., :, None] - g[..., None, :]
    return torch.exp(torch.where(mask, diff, torch.full_like(diff, -torch.inf)))


def decaying_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_g: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    eps: Any,
    normalize: bool,
    log_f: torch.Tensor | None,
    chunk: int,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """decay / gated over a sequence in chunks of `chunk` tokens.  q: the map's query form,
    eps a number or a per-token [B, H, T, 1] tensor (FAVOR+: eps·exp(log_f)); log_f [B, H, T, 1]
    undoes the query rescaling when normalize is False.  Returns (y [B, H, T, d_v], (S, z))."""
    b, h, t, f = q.shape
    dv = v.shape[-1]
    if state is None:
        s = q.new_zeros(b, h, f, dv)
        z = q.new_zeros(b, h, f)
    else:
        s, z = state
    sdt, cdt = s.dtype, q.dtype
    outs = []
    for i in range(0, t, chunk):
        qc, kc, vc = q[:, :, i : i + chunk], k[:, :, i : i + chunk], v[:, :, i : i + chunk]
        g = torch.cumsum(log_g[:, :, i : i + chunk], dim=-1)
        scores = (qc @ kc.transpose(-1, -2)) * _decays(g, strict=False)
        e_g = torch.exp(g)[..., None]
        num = scores @ vc + e_g * (qc @ s.to(cdt))
        if normalize:
            den = scores.sum(-1, keepdim=True) + e_g * (qc @ z.to(cdt)[..., None])
            e = eps[:, :, i : i + chunk] if isinstance(eps, torch.Tensor) else eps
            outs.append(num / (den + e))
        elif log_f is not None:
            outs.append(num * torch.exp(-log_f[:, :, i : i + chunk]))
        else:
            outs.append(num)
        g_n = g[..., -1:]
        kw = kc * torch.exp(g_n - g)[..., None]
        decay = torch.exp(g_n).to(sdt)
        s = s * decay[..., None] + (kw.transpose(-1, -2) @ vc).to(sdt)
        z = z * decay + kw.sum(2).to(sdt)
    return torch.cat(outs, dim=2), (s, z)


def delta_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_g: torch.Tensor,
    beta: torch.Tensor,
    s: torch.Tensor | None,
    *,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """delta / gated_delta over a sequence in chunks of `chunk` tokens.  q: textbook query
    features; k: unit keys.  Returns (y [B, H, T, d_v], S)."""
    b, h, t, f = q.shape
    dv = v.shape[-1]
    if s is None:
        s = q.new_zeros(b, h, f, dv)
    sdt, cdt = s.dtype, q.dtype
    outs = []
    for i in range(0, t, chunk):
        qc, kc, vc = q[:, :, i : i + chunk], k[:, :, i : i + chunk], v[:, :, i : i + chunk]
        bc = beta[:, :, i : i + chunk][..., None]
        g = torch.cumsum(log_g[:, :, i : i + chunk], dim=-1)
        n = qc.shape[2]
        e_g = torch.exp(g)[..., None]
        s0 = s.to(cdt)
        lower = bc * (kc @ kc.transpose(-1, -2)) * _decays(g, strict=True)
        eye = torch.eye(n, dtype=cdt, device=q.device)
        rhs = bc * (vc - e_g * (kc @ s0))
        u = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
        scores = (qc @ kc.transpose(-1, -2)) * _decays(g, strict=False)
        outs.append(e_g * (qc @ s0) + scores @ u)
        g_n = g[..., -1:]
        kw = kc * torch.exp(g_n - g)[..., None]
        s = s * torch.exp(g_n).to(sdt)[..., None] + (kw.transpose(-1, -2) @ u).to(sdt)
    return torch.cat(outs, dim=2), s
