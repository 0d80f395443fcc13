"""Chunkwise Numba kernel for the delta rules (WY / UT-transform form), one head per `prange`.

The gated delta step S_i = α_i (I - β_i k_i k_iᵀ) S_{i-1} + β_i k_i v_iᵀ is, with
u_i = β_i (v_i - α_i S_{i-1}ᵀ k_i),  S_i = α_i S_{i-1} + k_i u_iᵀ.  Unrolled over a chunk of n
tokens from S_0, with G_i = Σ_{j≤i} log α_j (0 for the plain delta rule):

    S_i = e^{G_i} S_0 + Σ_{j≤i} e^{G_i - G_j} k_j u_jᵀ
    u_i = β_i v_i - β_i e^{G_i} S_0ᵀk_i - Σ_{j<i} β_i e^{G_i - G_j} (k_i·k_j) u_j

so (I + L) U = B V - B e^{G} K S_0 with L strictly lower, L_ij = β_i e^{G_i - G_j} k_i·k_j.
The UT transform T = (I + L)^{-1} (lower unitriangular, by forward substitution on n×n) gives

    U = T (B V) - T (B e^{G} K) S_0                      (the WY pseudo-values and keys)
    Y = e^{G} Q S_0 + (Q Kᵀ ⊙ D) U,   D_ij = e^{G_i - G_j} for j ≤ i, else 0
    S_n = e^{G_n} S_0 + (e^{G_n - G} ⊙ K)ᵀ U

All exponents are ≤ 0.  Chunk math runs in the compute dtype; the contribution is added to the
state in the state's dtype.  z is not used by these rules.  The chunks end where the decaying
rules' kernel ends them (`chunk_end`: before a non-finite key or value, or a gate that erases the
state), and the first token's gate is kept out of the prefix sums in the same way (see there).
Decay factors below e^-60 (float32; e^-700 float64: `constants.flush_log`) are zeros, not
subnormal numbers (strong gates made this kernel ~17x slower on an Intel core), and so are the
factors T multiplies (e^{G_i}, in B e^{G} K) and the solve's L_ij and T_ir below the square root
of that, e^-30 (e^-350): their products with each other stay normal (with the first flush alone
the kernel still ran 4.6x slower at gates of -3 a token than at -0.05; now as fast).  Each term
left out is below e^-30 ≈ 2^-43 of the terms it is added to (T_ii = 1, β_i v_i), so over a
chunk of n ≤ 64 tokens they move a value by less than 2^-37 of its size, far under float32's
rounding (2^-24).  A chunk whose log gates are all 0 (the plain delta rule's) skips the decay
factors, each e^0 · 1 = 1 exactly: the same bits, and the kernel 1.12x faster on DeltaNet
~110M's shapes (12 heads of 64, 2,048 tokens, float32; measured here).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from linstream.ops.decay.constants import flush_log
from linstream.ops.decay.numba import chunk_end, floored_log_gates
from linstream.ops.numba_tools import exp
from numba import prange

__all__ = ["delta_chunks"]


@numba.njit(parallel=True, cache=True, nogil=True)
def _delta_chunks(qh, kh, vh, log_a, beta, s, out, c, flush):  # pragma: no cover - jitted
    """qh [H, T, F], kh [H, T, F] (unit keys), vh [H, T, d_v] in the compute dtype; log_a, beta
    [H, T] float64; s [H, F, d_v] the state, updated in place; out [H, T, d_v]; flush: the log
    decay below which a decay factor is 0 (`flush_log`; in the vectorized loops its exponential
    times 1 or 0, not a branch)."""
    nh, t, f = qh.shape
    dv = vh.shape[2]
    tiny = qh.dtype.type(math.exp(0.5 * flush))
    for h in prange(nh):
        g = np.empty(c, np.float64)
        qg = np.empty((c, f), qh.dtype)
        kb = np.empty((c, f), qh.dtype)
        kd = np.empty((c, f), qh.dtype)
        vb = np.empty((c, dv), qh.dtype)
        c0 = 0
        while c0 < t:
            n = chunk_end(kh, vh, log_a, h, c0, min(c0 + c, t)) - c0
            la0 = log_a[h, c0]  # the first token's gate, kept out of g
            acc = 0.0
            g[0] = acc
            flat = la0 == 0.0  # no decay in this chunk (the plain delta rule): every factor 1
            for i in range(1, n):
                acc += log_a[h, c0 + i]
                g[i] = acc
                flat &= acc == 0.0
            gn = g[n - 1]
            qc = qh[h, c0 : c0 + n]
            kc = kh[h, c0 : c0 + n]
            vc = vh[h, c0 : c0 + n]
            sc = s[h].astype(qh.dtype)
            for i in range(n):
                b = beta[h, c0 + i]
                x0, x1 = la0 + g[i], gn - g[i]
                e0 = math.exp(x0) if x0 > 0.5 * flush else 0.0  # T multiplies it: see tiny
                eg = qh.dtype.type(e0)
                ebg = qh.dtype.type(b * e0)
                ek = qh.dtype.type(math.exp(x1) if x1 > flush else 0.0)
                for p in range(f):
                    qg[i, p] = qc[i, p] * eg
                    kb[i, p] = kc[i, p] * ebg
                    kd[i, p] = kc[i, p] * ek
                bb = qh.dtype.type(b)
                for p in range(dv):
                    vb[i, p] = vc[i, p] * bb
            kk = np.dot(kc, kc.T)
            tt = np.zeros((n, n), qh.dtype)  # T = (I + L)^{-1} of this chunk
            # T = (I + L)^{-1} row by row: T_i = e_i - Σ_{j<i} L_ij T_j  (T_j is zero past j).
            # An L_ij or T_ir below `tiny` (e^{flush/2}) is taken as 0, so that the solve's
            # products of two of them stay normal numbers (at least e^flush)
            for i in range(n):
                tt[i, i] = 1
                bi = qh.dtype.type(beta[h, c0 + i])
                if flat:  # e^{G_i - G_j} = e^0 = 1 exactly (as `exp` gives it): L_ij = β_i k_i·k_j
                    for j in range(i):
                        kk[i, j] *= bi
                        kk[i, j] *= qh.dtype.type(abs(kk[i, j]) >= tiny)
                else:
                    for j in range(i):  # L_ij = β_i e^{G_i - G_j} k_i·k_j, in place of k_i·k_j
                        x = g[i] - g[j]
                        kk[i, j] *= bi * (exp(qh.dtype.type(x)) * qh.dtype.type(x > flush))
                        kk[i, j] *= qh.dtype.type(abs(kk[i, j]) >= tiny)
                for j in range(i):
                    lij = kk[i, j]
                    for r in range(j + 1):
                        tt[i, r] -= lij * tt[j, r]
                for r in range(i):
                    tt[i, r] *= qh.dtype.type(abs(tt[i, r]) >= tiny)
            u = np.dot(tt, vb[:n]) - np.dot(np.dot(tt, kb[:n]), sc)
            a = np.dot(qc, kc.T)
            for i in range(n):
                if not flat:  # (flat: each factor e^0 · 1 = 1)
                    for j in range(i + 1):
                        x = g[i] - g[j]
                        a[i, j] *= exp(qh.dtype.type(x)) * qh.dtype.type(x > flush)
                for j in range(i + 1, n):
                    a[i, j] = 0
            y = np.dot(qg[:n], sc) + np.dot(a, u)
            for i in range(n):
                for p in range(dv):
                    out[h, c0 + i, p] = y[i, p]
            upd = np.dot(kd[:n].T, u)
            eg = math.exp(la0 + gn) if la0 + gn > flush else 0.0
            for p in range(f):
                for r in range(dv):
                    s[h, p, r] = s[h, p, r] * eg + upd[p, r]
            c0 += n


def delta_chunks(
    qh: np.ndarray,
    kh: np.ndarray,
    vh: np.ndarray,
    s: np.ndarray,
    log_gate: np.ndarray,
    beta: np.ndarray,
    *,
    chunk_size: int,
) -> np.ndarray:
    """Head-major inputs (ops/rules/gather.py): qh [H, T, F], kh [H, T, F] unit keys, vh
    [H, T, d_v], one compute dtype; s [H, F, d_v] the state in the state dtype, updated in
    place; log_gate, beta [H, T] float64.  Returns out [H, T, d_v]."""
    t = qh.shape[1]
    out = np.empty(vh.shape, dtype=qh.dtype)
    c = max(1, min(int(chunk_size), t))
    lg = floored_log_gates(log_gate)
    bt = np.ascontiguousarray(beta, dtype=np.float64)
    _delta_chunks(qh, kh, vh, lg, bt, s, out, c, flush_log(qh.dtype, s.dtype))
    return out
