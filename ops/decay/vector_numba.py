"""Chunkwise Numba kernel for the vector-gated rule (a log gate per key dimension), one head per
`prange` iteration.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ        y_t = S_tᵀ q_t        (g_t ≤ 0 elementwise)

Within a chunk of n tokens, with G_i = Σ_{j≤i} g_j (the cumulative log gates from the chunk's
start, per key dimension p, float64) and S_0 the state before the chunk:

    y_i = (q_i ⊙ e^{G_i})ᵀ S_0 + Σ_{j≤i} A_ij v_j,    A_ij = Σ_p q_ip k_jp e^{G_ip − G_jp}
    S_n = diag(e^{G_n}) S_0 + Σ_j (k_j ⊙ e^{G_n − G_j}) v_jᵀ

Every exponent is ≤ 0, so nothing grows and no gate is divided out; the price is that A's
exponentials depend on the key dimension.  Pairs within a sub-block of SUB tokens are formed one
by one (vectorized over p); a pair across (j before the first token r of i's sub-block) splits
its exponential at r, e^{G_i − G_j} = e^{G_i − G_r} · e^{G_r − G_j}, both exponents again ≤ 0,
so a sub-block's rows against all earlier tokens are one product, (Q_I e^{G_I − G_r}) times
(K e^{G_r − G})ᵀ: about n·d_k·(n/SUB + SUB/2) exponentials a chunk instead of n²/2 · d_k.  A
term across carries one more exponential and one more rounded product, each relative to the
term, and nothing grows; the terms, their count and their bound are as before
(tests/ops/rules/test_vector_gate.py, unchanged: over 150 float32 cases at C 32 and 64, d_k up
to 96, the worst error was 9e-4 of the bound, before and after).  Chunk math runs in the compute
dtype; the chunk's contribution is added to the state in the state's dtype.

The chunks end where the scalar rules' kernels end them (`chunk_end` of ops/decay/numba.py,
given each token's smallest gate over the key dimensions): before a token with an Inf or NaN in
its key or value, or with a gate that erases the state in some key dimension.  The gates are
floored at LOG_GATE_FLOOR (e^-1000 is 0 in float64) and the chunk's first gate is kept out of
the prefix sums (G_i = g_first + g_i), as there; the floor and the smallest gates are taken in
the kernel as it reads the gates (a float64 copy of the gates beforehand, as `floored_log_gates`
makes for the scalar rules, added about half the kernel's time at H=4, T=2,048, d_k=d_v=64, one
thread, float32).  Without
this, an Inf or NaN value made the outputs of earlier tokens of its chunk NaN (a masked zero of
A times Inf), and a gate of -finfo.max (or -inf) at two tokens of a chunk summed to -inf, and
-inf - (-inf) made the state NaN for good.  Decay factors below e^-60 (float32; e^-700 float64)
are zeros, not subnormal numbers (`constants.flush_log`: strong gates made this kernel ~24x
slower on an Intel core).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from linstream.ops.decay.constants import DEFAULT_VECTOR_CHUNK, LOG_GATE_FLOOR, flush_log
from linstream.ops.decay.numba import chunk_end
from linstream.ops.numba_tools import FASTMATH, exp
from numba import prange

__all__ = ["DEFAULT_VECTOR_CHUNK", "SUB", "vector_gated_chunks"]

# A's sub-blocks (see the module docstring): pairs within one are formed one by one, pairs across
# as one product per sub-block of rows.
SUB = 16


@numba.njit(nogil=True, cache=True, inline="always")
def _floored(log_gate):  # pragma: no cover - jitted
    """log_gate as float64, raised to at least LOG_GATE_FLOOR (a NaN stays NaN)."""
    x = np.float64(log_gate)
    return LOG_GATE_FLOOR if x < LOG_GATE_FLOOR else x


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _vector_chunks(qh, kh, vh, gh, min_g, s, out, c, flush):  # pragma: no cover - jitted
    """qh, kh, gh [H, T, d_k]; vh [H, T, d_v] in the compute dtype; min_g [H, T] float64, filled
    with each token's smallest gate; s [H, d_k, d_v] the state, updated in place; out [H, T, d_v]
    in the compute dtype; flush: the log decay below which a decay factor is 0 (`flush_log`;
    each such factor is its exponential times 1 or 0, no branch in the vectorized loops)."""
    nh, t, dk = qh.shape
    dv = vh.shape[2]
    cdt = qh.dtype.type
    for h in prange(nh):
        for i in range(t):  # each token's smallest gate, for chunk_end
            m = 0.0
            for p in range(dk):
                m = min(m, np.float64(gh[h, i, p]))
            min_g[h, i] = m
        la0 = np.empty(dk, np.float64)
        g = np.empty((c, dk), np.float64)
        qg = np.empty((c, dk), qh.dtype)
        kd = np.empty((c, dk), qh.dtype)
        abuf = np.empty(c * c, qh.dtype)
        d = np.empty(dk, qh.dtype)
        qsbuf = np.empty(SUB * dk, qh.dtype)
        ksbuf = np.empty(c * dk, qh.dtype)
        blkbuf = np.empty(SUB * c, qh.dtype)
        c0 = 0
        while c0 < t:
            n = chunk_end(kh, vh, min_g, h, c0, min(c0 + c, t)) - c0
            for p in range(dk):  # the first token's gates, kept out of g
                la0[p] = _floored(gh[h, c0, p])
                g[0, p] = 0.0
            for i in range(1, n):
                for p in range(dk):
                    g[i, p] = g[i - 1, p] + _floored(gh[h, c0 + i, p])
            for i in range(n):
                for p in range(dk):
                    x0, x1 = la0[p] + g[i, p], g[n - 1, p] - g[i, p]
                    qg[i, p] = qh[h, c0 + i, p] * (exp(cdt(x0)) * cdt(x0 > flush))
                    kd[i, p] = kh[h, c0 + i, p] * (exp(cdt(x1)) * cdt(x1 > flush))
            a = abuf[: n * n].reshape((n, n))  # contiguous for np.dot
            for i in range(n):
                r0 = (i // SUB) * SUB  # pairs within i's sub-block: one by one
                for j in range(r0, i + 1):
                    for p in range(dk):
                        d[p] = cdt(g[i, p] - g[j, p])
                    acc = cdt(0)
                    for p in range(dk):
                        e = exp(d[p]) * cdt(d[p] > flush)
                        acc += qh[h, c0 + i, p] * kh[h, c0 + j, p] * e
                    a[i, j] = acc
                for j in range(i + 1, n):
                    a[i, j] = 0
            for r0 in range(SUB, n, SUB):  # pairs across: a product split at r0
                nb = min(r0 + SUB, n) - r0
                qs = qsbuf[: nb * dk].reshape((nb, dk))
                ks = ksbuf[: r0 * dk].reshape((r0, dk))
                blk = blkbuf[: nb * r0].reshape((nb, r0))
                for i in range(nb):
                    for p in range(dk):
                        x0 = g[r0 + i, p] - g[r0, p]
                        qs[i, p] = qh[h, c0 + r0 + i, p] * (exp(cdt(x0)) * cdt(x0 > flush))
                for j in range(r0):
                    for p in range(dk):
                        x1 = g[r0, p] - g[j, p]
                        ks[j, p] = kh[h, c0 + j, p] * (exp(cdt(x1)) * cdt(x1 > flush))
                np.dot(qs, ks.T, blk)
                for i in range(nb):
                    for j in range(r0):
                        a[r0 + i, j] = blk[i, j]
            vc = vh[h, c0 : c0 + n]
            sc = s[h].astype(qh.dtype)
            y = np.dot(qg[:n], sc) + np.dot(a, vc)
            for i in range(n):
                for r in range(dv):
                    out[h, c0 + i, r] = y[i, r]
            upd = np.dot(kd[:n].T, vc)
            for p in range(dk):
                x0 = la0[p] + g[n - 1, p]
                e = math.exp(x0) if x0 > flush else 0.0
                for r in range(dv):
                    s[h, p, r] = s[h, p, r] * e + upd[p, r]
            c0 += n


def vector_gated_chunks(
    qh: np.ndarray,
    kh: np.ndarray,
    vh: np.ndarray,
    gh: np.ndarray,
    s: np.ndarray,
    *,
    chunk_size: int = DEFAULT_VECTOR_CHUNK,
) -> np.ndarray:
    """Head-major inputs in one compute dtype (float32 or float64): qh, kh [H, T, d_k] (q already
    scaled), vh [H, T, d_v], gh [H, T, d_k] log gates ≤ 0; s [H, d_k, d_v] the state (float32 or
    float64), updated in place.  Returns out [H, T, d_v] in the compute dtype."""
    t = qh.shape[1]
    out = np.empty((qh.shape[0], t, vh.shape[2]), dtype=qh.dtype)
    if t == 0:
        return out
    c = max(1, min(int(chunk_size), t))
    min_g = np.empty(qh.shape[:2], np.float64)
    _vector_chunks(qh, kh, vh, gh, min_g, s, out, c, flush_log(qh.dtype, s.dtype))
    return out
