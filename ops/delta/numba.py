"""Chunkwise Numba kernel for the delta rules (U by forward substitution), one head per `prange`.

The gated delta step S_i = α_i (I - β_i k_i k_iᵀ) S_{i-1} + β_i k_i v_iᵀ is, with
u_i = β_i (v_i - α_i S_{i-1}ᵀ k_i),  S_i = α_i S_{i-1} + k_i u_iᵀ.  Unrolled over a chunk of n
tokens from S_0, with G_i = Σ_{j≤i} log α_j (0 for the plain delta rule):

    S_i = e^{G_i} S_0 + Σ_{j≤i} e^{G_i - G_j} k_j u_jᵀ
    u_i = β_i v_i - β_i e^{G_i} S_0ᵀk_i - Σ_{j<i} β_i e^{G_i - G_j} (k_i·k_j) u_j

so (I + L) U = B V - B e^{G} K S_0 with L strictly lower, L_ij = β_i e^{G_i - G_j} k_i·k_j.
U is its forward substitution, U_i = (B V - B e^{G} K S_0)_i - Σ_{j<i} L_ij U_j (n²/2 rows of
d_v: fewer operations than forming the UT transform T = (I + L)^{-1} and its two products, and
1.2-1.3x faster as a kernel on DeltaNet ~110M's shapes, plain and gated; measured here), by
blocks of SUBST rows: a block's terms from the rows before it as one product, L_IJ U_J, then its
own rows one by one (1.06x plain, 1.13x gated, the same shapes, one thread), then

    Y = e^{G} Q S_0 + (Q Kᵀ ⊙ D) U,   D_ij = e^{G_i - G_j} for j ≤ i, else 0
    S_n = e^{G_n} S_0 + (e^{G_n - G} ⊙ K)ᵀ U

A chunk's work is small matrix products (BLAS calls), n²·F multiply-adds a token for Q Kᵀ, K Kᵀ
and the substitution beside F·d_v for the state's; a caller naming no chunk (the fla families)
gets `constants.HOST_RULE_CHUNK` = 32 tokens (on DeltaNet ~110M's shapes the kernel 1.1-1.2x
faster than at the rules' 64, 16 tokens about as fast as 32 in the model; measured there).

All exponents are ≤ 0.  Chunk math runs in the compute dtype; the contribution is added to the
state in the state's dtype.  z is not used by these rules.  The chunks end where the decaying
rules' kernel ends them (`chunk_end`: before a non-finite key or value, or a gate that erases the
state), and the first token's gate is kept out of the prefix sums in the same way (see there).
Decay factors below e^-60 (float32; e^-700 float64: `constants.flush_log`) are zeros, not
subnormal numbers (strong gates made this kernel ~17x slower on an Intel core), and so are the
factors e^{G_i} of B e^{G} K and the substitution's L_ij below the square root of that, e^-30
(e^-350): their products with other values of the chunk stay normal (with the first flush alone
the kernel still ran 4.6x slower at gates of -3 a token than at -0.05).  A term left out,
L_ij U_j, is below e^-30 ≈ 2^-43 of U_j, so over a chunk of n ≤ 64 tokens they move a U_i by
less than 2^-37 of the chunk's largest, far under float32's rounding (2^-24).  A chunk whose
log gates are all 0 (the plain delta rule's) skips the decay factors, each e^0 · 1 = 1 exactly:
the same bits, and the kernel 1.12x faster on DeltaNet ~110M's shapes (12 heads of 64, 2,048
tokens, float32; measured here).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from linstream.ops.decay.constants import HOST_RULE_CHUNK, flush_log
from linstream.ops.decay.numba import chunk_end, floored_log_gates
from linstream.ops.numba_tools import exp
from numba import prange

__all__ = ["delta_chunks"]

SUBST = 16  # rows of U substituted one by one; the earlier rows' terms: one product per block


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
        lbuf = np.empty(c * c, qh.dtype)
        tbuf = np.empty(c * dv, qh.dtype)
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
                e0 = math.exp(x0) if x0 > 0.5 * flush else 0.0  # as L_ij: see tiny
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
            # U solves (I + L) U = B V - B e^G K S_0 by forward substitution, in place of its
            # right side: U_i = rhs_i - Σ_{j<i} L_ij U_j.  L_ij = β_i e^{G_i - G_j} k_i·k_j is
            # written over k_i·k_j; one below `tiny` (e^{flush/2}) is taken as 0
            kk = np.dot(kc, kc.T)
            u = vb[:n] - np.dot(kb[:n], sc)
            for i in range(n):
                bi = qh.dtype.type(beta[h, c0 + i])
                if flat:  # e^{G_i - G_j} = e^0 = 1 exactly (as `exp` gives it): L_ij = β_i k_i·k_j
                    for j in range(i):
                        kk[i, j] *= bi
                        kk[i, j] *= qh.dtype.type(abs(kk[i, j]) >= tiny)
                else:
                    for j in range(i):
                        x = g[i] - g[j]
                        kk[i, j] *= bi * (exp(qh.dtype.type(x)) * qh.dtype.type(x > flush))
                        kk[i, j] *= qh.dtype.type(abs(kk[i, j]) >= tiny)
            for b0 in range(0, n, SUBST):  # by blocks of rows: the earlier rows' terms as one
                b1 = min(b0 + SUBST, n)  # product, then the block's own rows one by one
                if b0 > 0:
                    lb = lbuf[: (b1 - b0) * b0].reshape((b1 - b0, b0))
                    for i in range(b0, b1):
                        for j in range(b0):
                            lb[i - b0, j] = kk[i, j]
                    tb = tbuf[: (b1 - b0) * dv].reshape((b1 - b0, dv))
                    np.dot(lb, u[:b0], tb)
                    for i in range(b0, b1):
                        for p in range(dv):
                            u[i, p] -= tb[i - b0, p]
                for i in range(b0 + 1, b1):
                    for j in range(b0, i):
                        lij = kk[i, j]
                        if lij != 0:
                            for p in range(dv):
                                u[i, p] -= lij * u[j, p]
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
    chunk_size: int = HOST_RULE_CHUNK,
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
