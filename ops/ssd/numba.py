"""Chunkwise Numba kernel for Mamba-2's SSD rule (the rule of `naive`), one head per `prange`.

Within a chunk of n tokens of head h (group g), with s_i its time steps, G_i = Σ_{j≤i} s_j·A_h
(the cumulative log decay from the chunk's start, float64) and S_0 [P, N] the state before it:

    y_i = e^{G_i} S_0 C_i + Σ_{j≤i} (C_i·B_j) e^{G_i − G_j} s_j x_j + D_h x_i
    S_n = e^{G_n} S_0 + Σ_j e^{G_n − G_j} s_j x_j B_jᵀ

so a chunk is four products: CBᵀ [n, n] (one per group: the heads of a group share it, formed
once per chunk and group before the heads run), the masked and decayed M @ X [n, P], the
state's part (C ⊙ e^{G}) S_0ᵀ [n, P], and the update (X ⊙ s e^{G_n − G})ᵀ B [P, N].  Every
exponent is ≤ 0, so nothing grows and no decay is divided out.  Chunk math runs in the compute
dtype (e^{G_i − G_j} with `numba_tools.exp`, the vectorizable float32 polynomial in float32);
the chunk's contribution is added to the state in the state's dtype.

The chunks are C tokens long, the same for every head, unless a token holds an Inf or NaN in its
x, B, C or time step: such a token only ever starts a chunk, so it never reaches the outputs of
earlier tokens (a masked zero times Inf is NaN).  The log decays are floored at LOG_GATE_FLOOR
(e^-1000 is 0 in float64; an infinite step then erases the state instead of making it NaN), and
the chunk's first one is kept out of the sums, as in the decaying rules' kernel
(`linstream.ops.decay.numba`).  Unlike there, a chunk does not end at a decay that erases the
state (the heads share their chunks, and their decays differ), so the segment sums are never
differences of prefix sums: G_i − G_j = Σ_{j<l≤i} s_l·A_h is summed directly (row i of M from
its diagonal down, in float64), and so is G_n − G_i (a suffix sum from the chunk's end).  A
segment sum's rounding is then relative to itself (≤ C·u64·|G_i − G_j|, so e^{G_i − G_j} is
off by at most C·u64·max_x x·e^{-x} = C·u64/e), whatever decays came earlier in the chunk; a
difference of prefix sums was off by C·u64·|G_i|, which grows with the decay before j.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from linstream.ops.decay.numba import LOG_GATE_FLOOR
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

from .constants import DEFAULT_SSD_CHUNK
from .steps import time_steps

__all__ = ["DEFAULT_SSD_CHUNK", "ssd_chunks"]


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def _row_finite(x, b, c, step, i):  # pragma: no cover - jitted
    """Whether token i's x [H, P], B and C [G, N] and time steps [H, T] are all finite
    (v − v is 0 for a finite v and NaN otherwise; the sum vectorizes)."""
    acc = 0.0
    for h in range(x.shape[1]):
        for p in range(x.shape[2]):
            acc += x[i, h, p] - x[i, h, p]
        acc += step[h, i] - step[h, i]
    for g in range(b.shape[1]):
        for q in range(b.shape[2]):
            acc += b[i, g, q] - b[i, g, q]
            acc += c[i, g, q] - c[i, g, q]
    return acc == 0.0


@numba.njit(nogil=True, cache=True)
def _chunk_starts(x, b, c, step, chunk):  # pragma: no cover - jitted
    """The chunks' first tokens, then T: every `chunk` tokens, and at each token with an Inf
    or NaN (`_row_finite`)."""
    t = x.shape[0]
    starts = np.empty(t + 1, np.int64)
    m = 0
    c0 = 0
    while c0 < t:
        starts[m] = c0
        m += 1
        end = min(c0 + chunk, t)
        i = c0 + 1
        while i < end and _row_finite(x, b, c, step, i):
            i += 1
        c0 = i
    starts[m] = t
    return starts[: m + 1]


def _ssd_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, b, c, step, a, d, s, out, starts, cb):  # pragma: no cover - compiled
        """x [T, H, P], b, c [T, G, N], d [H, P] in the compute dtype (any strides); step
        [H, T] and a [H] float64; s [H, P, N] the state, updated in place; out [T, H, P];
        starts the chunks' bounds; cb [chunks, G, C·C] work (each chunk's CBᵀ per group)."""
        _, nh, dp = x.shape
        ng, dn = b.shape[1], b.shape[2]
        m = starts.shape[0] - 1
        cmax = 1
        for k in range(m):
            cmax = max(cmax, starts[k + 1] - starts[k])
        dt = x.dtype
        for kg in prange(m * ng):  # CBᵀ of every chunk and group, shared by the group's heads
            k, g = kg // ng, kg % ng
            c0, n = starts[k], starts[k + 1] - starts[k]
            bc = np.empty((n, dn), dt)
            cc = np.empty((n, dn), dt)
            for i in range(n):
                for q in range(dn):
                    bc[i, q] = b[c0 + i, g, q]
                    cc[i, q] = c[c0 + i, g, q]
            prod = np.dot(cc, bc.T)
            for i in range(n):
                for j in range(n):
                    cb[k, g, i * n + j] = prod[i, j]
        rep = nh // ng
        for h in prange(nh):
            g = h // rep
            ah = a[h]
            gs = np.empty(cmax, np.float64)
            rs = np.empty(cmax, np.float64)
            la = np.empty(cmax, np.float64)
            seg = np.empty(cmax, np.float64)
            xc = np.empty((cmax, dp), dt)
            xd = np.empty((cmax, dp), dt)
            cg = np.empty((cmax, dn), dt)
            bc = np.empty((cmax, dn), dt)
            sw = np.empty(cmax, dt)
            for k in range(m):
                c0, n = starts[k], starts[k + 1] - starts[k]
                la0 = max(step[h, c0] * ah, LOG_GATE_FLOOR)  # kept out of the sums
                la[0] = 0.0
                for i in range(1, n):
                    la[i] = max(step[h, c0 + i] * ah, LOG_GATE_FLOOR)
                acc = 0.0  # G_i, summed from the chunk's start
                gs[0] = acc
                for i in range(1, n):
                    acc += la[i]
                    gs[i] = acc
                gn = gs[n - 1]
                acc = 0.0  # G_n − G_i, summed from the chunk's end
                rs[n - 1] = acc
                for i in range(n - 2, -1, -1):
                    acc += la[i + 1]
                    rs[i] = acc
                for i in range(n):
                    si = step[h, c0 + i]
                    eg = dt.type(math.exp(la0 + gs[i]))
                    ek = dt.type(si * math.exp(rs[i]))
                    sw[i] = dt.type(si)
                    for p in range(dp):
                        v = x[c0 + i, h, p]
                        xc[i, p] = v
                        xd[i, p] = v * ek
                    for q in range(dn):
                        cg[i, q] = c[c0 + i, g, q] * eg
                        bc[i, q] = b[c0 + i, g, q]
                mm = np.empty((n, n), dt)
                for i in range(n):
                    acc = 0.0  # G_i − G_j, summed from the diagonal down
                    for j in range(i, -1, -1):
                        seg[j] = acc
                        acc += la[j]
                    for j in range(i + 1):
                        mm[i, j] = cb[k, g, i * n + j] * exp(dt.type(seg[j])) * sw[j]
                    for j in range(i + 1, n):
                        mm[i, j] = 0
                s0 = s[h].astype(dt)  # [P, N]
                y = np.dot(mm, xc[:n]) + np.dot(cg[:n], s0.T)
                for i in range(n):
                    for p in range(dp):
                        out[c0 + i, h, p] = y[i, p] + d[h, p] * xc[i, p]
                upd = np.dot(xd[:n].T, bc[:n])  # [P, N]
                e = math.exp(la0 + gn)
                for p in range(dp):
                    for q in range(dn):
                        s[h, p, q] = s[h, p, q] * e + upd[p, q]

    return run


_SSD = {p: _ssd_kernel(p) for p in (False, True)}


def ssd_chunks(
    x: np.ndarray,
    dt: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    d: np.ndarray | None,
    state: np.ndarray,
    *,
    dt_bias: Any = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk_size: int = DEFAULT_SSD_CHUNK,
) -> np.ndarray:
    """Mamba-2's SSD over T tokens from `state`, chunk by chunk (see the module docstring).

    x [T, H, P], b, c [T, G, N] in the compute dtype (float32 or float64; any strides: views of
    the convolution's output are copied to C order once, where the kernel's loops over them
    vectorize: ~20% less time at Mamba-2 130M's sizes, the same bits); dt [T, H] the raw time
    steps (any float dtype and strides); a [H] (A = −exp(A_log)); d [H] or [H, P] (None: no
    skip); dt_bias [H]; dt_limit the clamp of the time steps; state [H, P, N] in the state
    dtype, updated in place.  Returns y [T, H, P] in the compute dtype (C-contiguous)."""
    t, h, p = x.shape
    ct = x.dtype
    out = np.empty((t, h, p), dtype=ct)
    if t == 0:
        return out
    x, b, c = (np.ascontiguousarray(v) for v in (x, b, c))
    step = np.ascontiguousarray(
        time_steps(dt, np.zeros(h) if dt_bias is None else dt_bias, dt_limit).T
    )  # [H, T]
    av = np.ascontiguousarray(a, dtype=np.float64)
    if d is None:
        dd = np.zeros((h, p), ct)
    else:
        dd = np.asarray(d, dtype=ct)
        dd = np.ascontiguousarray(np.broadcast_to(dd[:, None] if dd.ndim == 1 else dd, (h, p)))
    chunk = max(1, min(int(chunk_size), t))
    starts = _chunk_starts(x, b, c, step, chunk)
    g, n = b.shape[1], b.shape[2]
    cb = np.empty((starts.shape[0] - 1, g, chunk * chunk), dtype=ct)
    work = t * h * p * (2 * n + chunk)
    _SSD[worth_threads(work)](x, b, c, step, av, dd, state, out, starts, cb)
    return out
