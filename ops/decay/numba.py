"""Chunkwise Numba kernel for the decaying rules (decay, gated), one head per `prange` iteration.

Within a chunk of n tokens, with G_i = Σ_{j≤i} log α_j (cumulative log gate from the chunk's
start, float64) and the state S_0, z_0 before the chunk:

    S_i = e^{G_i} S_0 + Σ_{j≤i} e^{G_i - G_j} k_j v_jᵀ      (z likewise, with 1 for v_j)
    y_i = [e^{G_i} q_iᵀS_0 + Σ_{j≤i} e^{G_i-G_j} (q_i·k_j) v_jᵀ] / ( same for z + eps_i )
    S_n = e^{G_n} S_0 + Σ_j e^{G_n - G_j} k_j v_jᵀ

Every exponent G_i - G_j (j ≤ i), G_i and G_n - G_j is ≤ 0, so nothing grows: the gates are
never divided out.  z rides as an extra value column (v gets a column of ones), so one product
serves numerator and denominator.  Chunk math runs in the compute dtype; the chunk's
contribution is added to the state in the state's dtype; the ratio is formed in float64.

The chunks are C tokens long unless `chunk_end` ends one early, shared with the delta rules'
kernel: a token with an Inf or NaN in its key or value, or with a gate that erases the state
(log α < ERASING_GATE), only ever starts a chunk.  The prefix sums g_i = G_i - log α_first leave
the first token's gate out (it enters only e^{G_i} = α_first e^{g_i} and e^{G_n}), so a huge gate
never sits inside the sums whose differences give e^{G_i - G_j}.  Without this, an Inf value
made the outputs of earlier tokens of its chunk NaN (a masked zero times Inf), and a gate of
-finfo(float64).max at two tokens of a chunk summed to -inf and -inf - (-inf) made the state NaN.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from linstream.ops.decay.constants import ERASING_GATE, HOST_RULE_CHUNK, LOG_GATE_FLOOR
from linstream.ops.numba_tools import FASTMATH, exp
from numba import prange

__all__ = ["ERASING_GATE", "LOG_GATE_FLOOR", "chunk_end", "decay_chunks", "floored_log_gates"]


def floored_log_gates(log_gate: np.ndarray) -> np.ndarray:
    """log_gate [H, T] as float64, C-contiguous, raised to at least LOG_GATE_FLOOR."""
    return np.ascontiguousarray(np.maximum(log_gate, LOG_GATE_FLOOR), dtype=np.float64)


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def chunk_end(kh, vh, log_a, h, start, stop):  # pragma: no cover - jitted
    """Where the chunk of head h that starts at token `start` ends (exclusive, <= stop): before
    the first later token whose key kh[h, i] or value vh[h, i] holds an Inf or NaN, or whose
    log gate log_a[h, i] is below ERASING_GATE (a vector gate passes its smallest over d_k).
    A token's key and value are checked in one sum of x · 0 (0 for a finite x, NaN otherwise),
    which vectorizes (FASTMATH keeps NaN and Inf, so x · 0 is not folded to 0; a sum of x − x
    may be, by reassociation); a test and branch per value did not vectorize."""
    for i in range(start + 1, stop):
        if log_a[h, i] < ERASING_GATE:
            return i
        z = 0.0
        for p in range(kh.shape[2]):
            z += kh[h, i, p] * 0.0
        for p in range(vh.shape[2]):
            z += vh[h, i, p] * 0.0
        if z != 0.0:  # NaN != 0
            return i
    return stop


@numba.njit(parallel=True, cache=True, nogil=True)
def _decay_chunks(qh, kh, vh, log_a, eps_t, s, out, c, normalize):  # pragma: no cover - jitted
    """qh, kh [H, T, F]; vh [H, T, d_v+1] (last column ones) in the compute dtype; log_a (floored),
    eps_t [H, T] float64; s [H, F, d_v+1] the state (z in the last column), updated in place;
    out [H, T, d_v] in the compute dtype."""
    nh, t, f = qh.shape
    dv = vh.shape[2] - 1
    for h in prange(nh):
        g = np.empty(c, np.float64)
        qg = np.empty((c, f), qh.dtype)
        kd = np.empty((c, f), qh.dtype)
        c0 = 0
        while c0 < t:
            n = chunk_end(kh, vh, log_a, h, c0, min(c0 + c, t)) - c0
            la0 = log_a[h, c0]  # the first token's gate, kept out of g
            acc = 0.0
            g[0] = acc
            for i in range(1, n):
                acc += log_a[h, c0 + i]
                g[i] = acc
            qc = qh[h, c0 : c0 + n]
            kc = kh[h, c0 : c0 + n]
            vc = vh[h, c0 : c0 + n]
            sc = s[h].astype(qh.dtype)
            gn = g[n - 1]
            for i in range(n):
                eg = qh.dtype.type(math.exp(la0 + g[i]))
                ek = qh.dtype.type(math.exp(gn - g[i]))
                for p in range(f):
                    qg[i, p] = qc[i, p] * eg
                    kd[i, p] = kc[i, p] * ek
            nd = np.dot(qg[:n], sc)
            a = np.dot(qc, kc.T)
            for i in range(n):
                for j in range(i + 1):
                    a[i, j] *= exp(qh.dtype.type(g[i] - g[j]))
                for j in range(i + 1, n):
                    a[i, j] = 0
            nd += np.dot(a, vc)
            for i in range(n):
                if normalize:
                    den = np.float64(nd[i, dv]) + eps_t[h, c0 + i]
                    for p in range(dv):
                        out[h, c0 + i, p] = np.float64(nd[i, p]) / den
                else:
                    for p in range(dv):
                        out[h, c0 + i, p] = nd[i, p]
            upd = np.dot(kd[:n].T, vc)
            eg = math.exp(la0 + gn)
            for p in range(f):
                for r in range(dv + 1):
                    s[h, p, r] = s[h, p, r] * eg + upd[p, r]
            c0 += n


def decay_chunks(
    qh: np.ndarray,
    kh: np.ndarray,
    vh: np.ndarray,
    sx: np.ndarray,
    log_gate: np.ndarray,
    eps_t: np.ndarray,
    *,
    normalize: bool,
    chunk_size: int = HOST_RULE_CHUNK,
) -> np.ndarray:
    """Head-major inputs (ops/rules/gather.py): qh, kh [H, T, F] mapped, vh [H, T, d_v+1] with a
    ones column, one compute dtype; sx [H, F, d_v+1] the state (S, then z as the last column) in
    the state dtype, updated in place; log_gate, eps_t [H, T] float64.  Returns out
    [H, T, d_v]."""
    h, t, _ = qh.shape
    out = np.empty((h, t, vh.shape[2] - 1), dtype=qh.dtype)
    c = max(1, min(int(chunk_size), t))
    lg = floored_log_gates(log_gate)
    et = np.ascontiguousarray(eps_t, dtype=np.float64)
    _decay_chunks(qh, kh, vh, lg, et, sx, out, c, bool(normalize))
    return out
