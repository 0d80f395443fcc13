"""Chunkwise Numba kernel for the vector-gated rule (a log gate per key dimension), one head per
`prange` iteration.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ        y_t = S_tᵀ q_t        (g_t ≤ 0 elementwise)

Within a chunk of n tokens, with G_i = Σ_{j≤i} g_j (the cumulative log gates from the chunk's
start, per key dimension p, float64) and S_0 the state before the chunk:

    y_i = (q_i ⊙ e^{G_i})ᵀ S_0 + Σ_{j≤i} A_ij v_j,    A_ij = Σ_p q_ip k_jp e^{G_ip − G_jp}
    S_n = diag(e^{G_n}) S_0 + Σ_j (k_j ⊙ e^{G_n − G_j}) v_jᵀ

A's exponentials depend on the key dimension.  A dimension p is *narrow* in a chunk when its
gates sum to at least −NARROW_SPAN over it (G_{n,p} ≥ −30, float32; the usual case: GLA's
gates, logsigmoid/16, sum to a few units over 32 tokens).  Its part of A factors about the
midpoint M_p = G_{n,p}/2: e^{G_ip − G_jp} = e^{G_ip − M_p} · e^{M_p − G_jp}, both factors within
[e^−15, e^15] (normal, far from the flush), so the narrow dimensions' part of A is one product,
(Q e^{G − M}) (K e^{M − G})ᵀ with its upper triangle set to 0.  Each factor's exponent is rounded
to the compute dtype and that rounding put back to first order (e^{x0} (1 + (x − x0))), so a
factor errs by about an ulp whatever its exponent.  The other dimensions (*wide*: gates that
forget within the chunk, where e^{−G_j} could overflow) keep the exponents ≤ 0: pairs within a
sub-block of SUB tokens formed one by one (vectorized over p), a pair across (j before the
first token r of i's sub-block) split at r, e^{G_i − G_j} = e^{G_i − G_r} · e^{G_r − G_j}, so a
sub-block's rows against all earlier tokens are one product: about n·d_k·(n/SUB + SUB/2)
exponentials a chunk for those dimensions (gathered), against 2·n·d_k for the narrow ones.  A
factored term carries one more exponential and one more rounded product, each relative to the
term, and nothing grows; the terms, their count and their bound are as before
(tests/ops/rules/test_vector_gate.py, unchanged: over 150 float32 cases at C 16 to 64, d_k up to
96 and gates of −0.05 to −1 a token, the worst error was 1.8e-2 of the bound before and 2.5e-2
after, the median error 1.1e-7 and 1.3e-7 of the largest output).  On GLA ~110M's shapes (4
heads, d_k 96, d_v 192, 2,048 tokens, one thread) the kernel runs 1.4× faster; on strong gates
(every dimension wide) as before.  Chunk math runs in the compute dtype; the chunk's
contribution is added to the state in the state's dtype.

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

__all__ = ["DEFAULT_VECTOR_CHUNK", "NARROW_SPAN", "SUB", "vector_gated_chunks"]

# A's sub-blocks (see the module docstring): pairs within one are formed one by one, pairs across
# as one product per sub-block of rows.
SUB = 16
# A key dimension is narrow in a chunk when its log gates sum to at least -NARROW_SPAN over it:
# its factors e^{G_i - M} and e^{M - G_j} (M the midpoint of its G) then lie in [e^-15, e^15],
# normal and far from the flush (e^-60 in float32), and its part of A is one product (the
# module docstring)
NARROW_SPAN = 30.0
NARROW_SPAN_F64 = 300.0  # float64: the flush is e^-700


@numba.njit(nogil=True, cache=True, inline="always")
def _floored(log_gate):  # pragma: no cover - jitted
    """log_gate as float64, raised to at least LOG_GATE_FLOOR (a NaN stays NaN)."""
    x = np.float64(log_gate)
    return LOG_GATE_FLOOR if x < LOG_GATE_FLOOR else x


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _wide_pairs(qw, kw, gw, a, d, qsbuf, ksbuf, blkbuf, flush):  # pragma: no cover - jitted
    """Adds to a [n, n] the terms of the wide key dimensions, gathered as qw, kw [n, nu] and
    their cumulative log gates gw [n, nu] (float64): pairs within a sub-block of SUB tokens one
    by one, pairs across as one product per sub-block of rows split at its first token."""
    cdt = qw.dtype.type
    n, nu = qw.shape
    for i in range(n):
        r0 = (i // SUB) * SUB  # pairs within i's sub-block: one by one
        for j in range(r0, i + 1):
            for u in range(nu):
                d[u] = cdt(gw[i, u] - gw[j, u])
            acc = cdt(0)
            for u in range(nu):
                e = exp(d[u]) * cdt(d[u] > flush)
                acc += qw[i, u] * kw[j, u] * e
            a[i, j] += acc
    for r0 in range(SUB, n, SUB):  # pairs across: a product split at r0
        nb = min(r0 + SUB, n) - r0
        qs = qsbuf[: nb * nu].reshape((nb, nu))
        ks = ksbuf[: r0 * nu].reshape((r0, nu))
        blk = blkbuf[: nb * r0].reshape((nb, r0))
        for i in range(nb):
            for u in range(nu):
                x0 = gw[r0 + i, u] - gw[r0, u]
                qs[i, u] = qw[r0 + i, u] * (exp(cdt(x0)) * cdt(x0 > flush))
        for j in range(r0):
            for u in range(nu):
                x1 = gw[r0, u] - gw[j, u]
                ks[j, u] = kw[j, u] * (exp(cdt(x1)) * cdt(x1 > flush))
        np.dot(qs, ks.T, blk)
        for i in range(nb):
            for j in range(r0):
                a[r0 + i, j] += blk[i, j]


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _vector_chunks(qh, kh, vh, gh, min_g, s, out, c, flush, span):  # pragma: no cover - jitted
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
        qfbuf = np.empty(c * dk, qh.dtype)
        kfbuf = np.empty(c * dk, qh.dtype)
        wide = np.empty(dk, np.int64)
        narrow = np.empty(dk, qh.dtype)
        qwbuf = np.empty(c * dk, qh.dtype)
        kwbuf = np.empty(c * dk, qh.dtype)
        gwbuf = np.empty(c * dk, np.float64)
        y0buf = np.empty(c * dv, qh.dtype)
        y1buf = np.empty(c * dv, qh.dtype)
        upd = np.empty((dk, dv), qh.dtype)
        sc = s[h].astype(qh.dtype)  # the state in the compute dtype (kept by the update below)
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
            # key dimensions whose gates over the chunk sum to at least -span: their part of
            # A as one product (a NaN sum is not, and goes to the pairs below)
            nu = 0
            for p in range(dk):
                near = g[n - 1, p] >= -span
                narrow[p] = cdt(near)
                if not near:
                    wide[nu] = p
                    nu += 1
            a = abuf[: n * n].reshape((n, n))  # contiguous for np.dot
            if nu < dk:
                qf = qfbuf[: n * dk].reshape((n, dk))
                kf = kfbuf[: n * dk].reshape((n, dk))
                for i in range(n):
                    for p in range(dk):  # a wide dimension's exponent 0, its factors 0
                        x = (g[i, p] - 0.5 * g[n - 1, p]) * narrow[p]
                        x0 = cdt(x)
                        x1 = cdt(x - x0)  # the rounding of x0, put back: e^x0 (1 + x1)
                        qf[i, p] = qh[h, c0 + i, p] * (exp(x0) * (narrow[p] + x1))
                        kf[i, p] = kh[h, c0 + i, p] * (exp(-x0) * (narrow[p] - x1))
                np.dot(qf, kf.T, a)
                for i in range(n):
                    for j in range(i + 1, n):
                        a[i, j] = 0
            else:
                a[:] = 0
            if nu == dk:  # every dimension wide: their pairs, as they lie
                qw, kw = qh[h, c0 : c0 + n], kh[h, c0 : c0 + n]
                _wide_pairs(qw, kw, g[:n], a, d, qsbuf, ksbuf, blkbuf, flush)
            elif nu > 0:  # the wide dimensions gathered, then their pairs
                qw = qwbuf[: n * nu].reshape((n, nu))
                kw = kwbuf[: n * nu].reshape((n, nu))
                gw = gwbuf[: n * nu].reshape((n, nu))
                for i in range(n):
                    for u in range(nu):
                        p = wide[u]
                        qw[i, u] = qh[h, c0 + i, p]
                        kw[i, u] = kh[h, c0 + i, p]
                        gw[i, u] = g[i, p]
                _wide_pairs(qw, kw, gw, a, d, qsbuf, ksbuf, blkbuf, flush)
            vc = vh[h, c0 : c0 + n]
            y0 = y0buf[: n * dv].reshape((n, dv))
            y1 = y1buf[: n * dv].reshape((n, dv))
            np.dot(qg[:n], sc, y0)
            np.dot(a, vc, y1)
            for i in range(n):
                for r in range(dv):
                    out[h, c0 + i, r] = y0[i, r] + y1[i, r]
            np.dot(kd[:n].T, vc, upd)
            for p in range(dk):  # the state, and its copy in the compute dtype for the next chunk
                x0 = la0[p] + g[n - 1, p]
                e = math.exp(x0) if x0 > flush else 0.0
                for r in range(dv):
                    x = s[h, p, r] * e + upd[p, r]
                    s[h, p, r] = x
                    sc[p, r] = x
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
    span = NARROW_SPAN if qh.dtype == np.float32 else NARROW_SPAN_F64
    _vector_chunks(qh, kh, vh, gh, min_g, s, out, c, flush_log(qh.dtype, s.dtype), span)
    return out
