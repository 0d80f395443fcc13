"""Chunkwise Numba kernel for the generalized delta rule in DPLR form (RWKV-7's time mix), one
head per `prange` iteration, in the WY / UT-transform form of fla's chunk kernels.

    S_t = diag(e^{w_t}) S_{t-1} + b_t (a_tᵀ S_{t-1}) + k_t v_tᵀ        o_t = S_tᵀ q_t

Within a chunk of n tokens from the state S_0, with G_i = Σ_{j≤i} w_j (cumulative log decays per
key dimension, float64) and u_i = S_{i-1}ᵀ a_i (what the rank-1 term reads), unrolling gives

    S_i = e^{G_i} ⊙ S_0 + Σ_{j≤i} e^{G_i − G_j} ⊙ (k_j v_jᵀ + b_j u_jᵀ)      (⊙: per key row)
    u_i = S_0ᵀ(a_i e^{G_{i-1}}) + Σ_{j<i} A_ak[i,j] v_j + A_ab[i,j] u_j
    o_i = S_0ᵀ(q_i e^{G_i})     + Σ_{j≤i} A_qk[i,j] v_j + A_qb[i,j] u_j
    A_xy[i,j] = Σ_p x_ip y_jp e^{G_{i'}p − G_jp}    (i' = i−1 for the a rows, i for the q rows)

so U solves the unit lower-triangular system (I − A_ab) U = A_ak V + (A e^{G_{i-1}}) S_0 (the
UT transform, by forward substitution), then O = (Q e^{G}) S_0 + A_qk V + A_qb U and
S_n = e^{G_n} ⊙ S_0 + (K e^{G_n − G})ᵀ V + (B e^{G_n − G})ᵀ U.

The four A matrices are one product: [Q e^{G'}; A e^{G'_{i-1}}] · [K e^{−G'}; B e^{−G'}]ᵀ, the
decays split at the chunk's start, with G'_i = G_i − w_first (the first token's decay kept out:
it enters only through S_0's terms).  Each product term is then e^{G'_i − G'_j} times its values
up to rounding (a relative 3u, as a pair-by-pair exponential would give), but the factors
e^{−G'_j} grow with the chunk's total decay: so a chunk ends early, before the token at which
the decays since its first token would sum below −SPAN (40 in float32: e^40 ≈ 2e17, with
e^-40 still a normal float32; 300 in float64).  RWKV-7's decays are ≥ −e^{-1/2} ≈ −0.607 per
token, so 63 of them sum to ≥ −38.2 and its chunks of up to 64 are never cut.  A decay that
erases the state (far below −SPAN) always starts a chunk, where it is kept out of G'.  This is
fla's secondary chunking done by the decays' own size: fla cuts at fixed sub-chunks of 16
because its bfloat16 tensor-core products cannot take the range; the float32/float64 products
here can, up to SPAN.

A chunk also ends before a token whose k, v, a or b holds an Inf or NaN (a masked zero times
Inf would make earlier tokens' outputs NaN), or whose decay is NaN.  Decays are floored at
LOG_GATE_FLOOR (e^-1000 = 0).  Chunk math runs in the inputs' dtype (float32 or float64); the
chunk's contribution is added to the state in the state's dtype.  Inputs are [T, H, D] with any
strides (the model's projections, reshaped, without a copy to head-major).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from linstream.ops.decay.numba import LOG_GATE_FLOOR
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

from .constants import DEFAULT_DPLR_CHUNK, SPAN

__all__ = ["DEFAULT_DPLR_CHUNK", "SPAN", "dplr_chunks"]


@numba.njit(nogil=True, cache=True, inline="always")
def _floored(log_w):  # pragma: no cover - jitted
    """log_w as float64, raised to at least LOG_GATE_FLOOR (a NaN stays NaN)."""
    x = np.float64(log_w)
    return LOG_GATE_FLOOR if x < LOG_GATE_FLOOR else x


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def _chunk_end(k, v, a, b, min_w, h, start, stop, span):  # pragma: no cover - jitted
    """Where head h's chunk that starts at `start` ends (exclusive, ≤ stop): before the first
    later token whose decays since `start` (each token's smallest over d_k) sum below −span,
    or whose k, v, a or b holds an Inf or NaN (or whose decay is NaN).  A token's values are
    checked in one sum of x · 0 (0 for a finite x, NaN otherwise), which vectorizes (FASTMATH
    keeps NaN and Inf, so x · 0 is not folded to 0; a sum of x − x was: reassociation cancels
    its terms); a test and branch per value did not vectorize."""
    acc = 0.0
    for i in range(start + 1, stop):
        acc += min_w[h, i]
        if not acc >= -span:
            return i
        z = 0.0
        for p in range(k.shape[2]):
            z += k[i, h, p] * 0.0 + a[i, h, p] * 0.0 + b[i, h, p] * 0.0
        for p in range(v.shape[2]):
            z += v[i, h, p] * 0.0
        if z != 0.0:  # NaN != 0
            return i
    return stop


def _kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(q, k, v, a, b, lw, s, out, min_w, c, span):  # pragma: no cover - compiled
        """q, k, a, b, lw [T, H, d_k]; v [T, H, d_v]; s [H, d_k, d_v] updated in place; out
        [T, H, d_v]; min_w [H, T] float64 scratch (each token's smallest decay)."""
        t, nh, dk = q.shape
        dv = v.shape[2]
        cdt = q.dtype.type
        for h in prange(nh):
            for i in range(t):
                m = 0.0
                for p in range(dk):
                    x = _floored(lw[i, h, p])
                    if x < m or math.isnan(x):
                        m = x
                min_w[h, i] = m
            gf = np.empty(dk, np.float64)
            g = np.empty((c, dk), np.float64)
            xbuf = np.empty(2 * c * dk, q.dtype)
            ybuf = np.empty(2 * c * dk, q.dtype)
            kbuf = np.empty(2 * c * dk, q.dtype)
            zbuf = np.empty((2 * c + dk) * dv, q.dtype)
            abuf = np.empty(c * c, q.dtype)
            obuf = np.empty(c * (2 * c + dk), q.dtype)
            q0 = np.empty((c, dk), q.dtype)
            a0 = np.empty((c, dk), q.dtype)
            en = np.empty(dk, q.dtype)
            e_prev = np.empty(dk, q.dtype)
            e0_prev = np.empty(dk, q.dtype)
            acc = np.empty(dv, q.dtype)
            mbuf = np.empty(4 * c * c, q.dtype)  # the products' results, none allocated a chunk
            rbuf = np.empty(c * dv, q.dtype)
            r2buf = np.empty(c * dv, q.dtype)
            obuf2 = np.empty(c * dv, q.dtype)
            upd = np.empty((dk, dv), q.dtype)
            c0 = 0
            while c0 < t:
                n = _chunk_end(k, v, a, b, min_w, h, c0, min(c0 + c, t), span) - c0
                n2 = 2 * n
                for p in range(dk):
                    gf[p] = _floored(lw[c0, h, p])
                    g[0, p] = 0.0
                for i in range(1, n):
                    for p in range(dk):
                        g[i, p] = g[i - 1, p] + _floored(lw[c0 + i, h, p])
                xs = xbuf[: n2 * dk].reshape((n2, dk))  # [q e^{G'}; a e^{G'_{i-1}}]
                ys = ybuf[: n2 * dk].reshape((n2, dk))  # [k e^{-G'}; b e^{-G'}]
                kb = kbuf[: n2 * dk].reshape((n2, dk))  # [k e^{G'_n - G'}; b e^{G'_n - G'}]
                for p in range(dk):
                    en[p] = exp(cdt(g[n - 1, p]))
                    e_prev[p] = 1  # e^{G'_{-1}}: the a row of the first token has no pairs
                    e0_prev[p] = 1  # e^{G_{-1}}: the first token reads S_0 undecayed
                for i in range(n):
                    for p in range(dk):
                        gi = g[i, p]
                        e = exp(cdt(gi))
                        ei = exp(cdt(-gi))
                        e0 = exp(cdt(gf[p] + gi))
                        qv = q[c0 + i, h, p]
                        kv = k[c0 + i, h, p]
                        av = a[c0 + i, h, p]
                        bv = b[c0 + i, h, p]
                        xs[i, p] = qv * e
                        xs[n + i, p] = av * e_prev[p]
                        q0[i, p] = qv * e0
                        a0[i, p] = av * e0_prev[p]
                        ys[i, p] = kv * ei
                        ys[n + i, p] = bv * ei
                        kb[i, p] = kv * (en[p] * ei)
                        kb[n + i, p] = bv * (en[p] * ei)
                        e_prev[p] = e
                        e0_prev[p] = e0
                for p in range(dk):
                    xs[n, p] = 0
                mm = mbuf[: n2 * n2].reshape((n2, n2))
                np.dot(xs, ys.T, mm)  # [[A_qk, A_qb], [A_ak, A_ab]] before their masks
                zs = zbuf[: (n2 + dk) * dv].reshape((n2 + dk, dv))  # [V; U; S_0]
                for i in range(n):
                    for r in range(dv):
                        zs[i, r] = v[c0 + i, h, r]
                for p in range(dk):
                    for r in range(dv):
                        zs[n2 + p, r] = cdt(s[h, p, r])
                aak = abuf[: n * n].reshape((n, n))
                for i in range(n):
                    for j in range(i):
                        aak[i, j] = mm[n + i, j]
                    for j in range(i, n):
                        aak[i, j] = 0
                rr = rbuf[: n * dv].reshape((n, dv))
                r2 = r2buf[: n * dv].reshape((n, dv))
                np.dot(aak, zs[:n], rr)
                np.dot(a0[:n], zs[n2:], r2)
                for i in range(n):
                    for r in range(dv):
                        rr[i, r] = rr[i, r] + r2[i, r]
                for i in range(n):  # U_i = R_i + Σ_{j<i} A_ab[i,j] U_j
                    for r in range(dv):
                        acc[r] = rr[i, r]
                    for j in range(i):
                        cij = mm[n + i, n + j]
                        for r in range(dv):
                            acc[r] += cij * zs[n + j, r]
                    for r in range(dv):
                        zs[n + i, r] = acc[r]
                oa = obuf[: n * (n2 + dk)].reshape((n, n2 + dk))  # [A_qk | A_qb | Q e^{G}]
                for i in range(n):
                    for j in range(i + 1):
                        oa[i, j] = mm[i, j]
                        oa[i, n + j] = mm[i, n + j]
                    for j in range(i + 1, n):
                        oa[i, j] = 0
                        oa[i, n + j] = 0
                    for p in range(dk):
                        oa[i, n2 + p] = q0[i, p]
                y = obuf2[: n * dv].reshape((n, dv))
                np.dot(oa, zs, y)
                for i in range(n):
                    for r in range(dv):
                        out[c0 + i, h, r] = y[i, r]
                np.dot(kb.T, zs[:n2], upd)
                for p in range(dk):
                    e = math.exp(gf[p] + g[n - 1, p])
                    for r in range(dv):
                        s[h, p, r] = s[h, p, r] * e + upd[p, r]
                c0 += n

    return run


_KERNEL = {p: _kernel(p) for p in (False, True)}


def dplr_chunks(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    log_w: np.ndarray,
    s: np.ndarray,
    *,
    chunk_size: int = DEFAULT_DPLR_CHUNK,
) -> np.ndarray:
    """q, k, a, b, log_w [T, H, d_k] (log decays ≤ 0) and v [T, H, d_v] in one compute dtype
    (float32 or float64), any strides; s [H, d_k, d_v] the state (float32 or float64),
    updated in place.  Returns out [T, H, d_v] in the compute dtype."""
    t, h, dk = q.shape
    dv = v.shape[2]
    out = np.empty((t, h, dv), dtype=q.dtype)
    if t == 0:
        return out
    c = max(1, min(int(chunk_size), t))
    min_w = np.empty((h, t), np.float64)
    work = t * h * dk * (4 * c + 6 * dv)
    _KERNEL[worth_threads(work)](q, k, v, a, b, log_w, s, out, min_w, c, SPAN[q.dtype])
    return out
