"""Chunkwise Numba kernel for Mamba-2's SSD rule (the rule of `naive`), head blocks per `prange`.

Within a chunk of n tokens of head h (group g), with s_i its time steps, G_i = Σ_{j≤i} s_j·A_h
(the cumulative log decay from the chunk's start, float64) and S_0 [P, N] the state before it:

    y_i = e^{G_i} S_0 C_i + Σ_{j≤i} (C_i·B_j) e^{G_i − G_j} s_j x_j + D_h x_i
    S_n = e^{G_n} S_0 + Σ_j e^{G_n − G_j} s_j x_j B_jᵀ

so a chunk is four products: CBᵀ [n, n] (one per group: the heads of a group share it, formed
once per chunk and group before the heads run), the masked and decayed M @ X [n, P], the
state's part e^{G} ⊙ (C S_0ᵀ) [n, P], and the update (X ⊙ s e^{G_n − G})ᵀ B [P, N].  The heads of
a group share B and C, so the state's two products run for a block of heads at once (B_h heads
of the group side by side: C [S_0 …]ᵀ [n, B_h·P] and [X ⊙ … ; …]ᵀ B [B_h·P, N]), the blocks fixed
by the shapes alone (BLOCK_COLUMNS), each block one `prange` turn: the bits never depend on the
number of threads.  The heads' work arrays are allocated once per block, none per token.  Every
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
differences of prefix sums: G_i − G_j = Σ_{j<l≤i} s_l·A_h is summed directly (row i of M as
row i − 1's sums plus s_i·A_h, one vector add a row, in float64), and so is G_n − G_i (a
suffix sum from the chunk's end).  A segment sum's rounding is then relative to itself
(≤ C·u64·|G_i − G_j|, so e^{G_i − G_j} is off by at most C·u64·max_x x·e^{-x} = C·u64/e),
whatever decays came earlier in the chunk; a difference of prefix sums was off by C·u64·|G_i|,
which grows with the decay before j.

A decay factor e^x with x below the flush (`constants.flush_log`: −60 where the chunk math or
the state is float32, −700 in float64) is taken as 0, not computed: subnormal numbers cost an
Intel core a microcode assist per instruction (Mamba-2 ~130M's SSD took 3.7 s of a 2,048-token
float32 chunk with them, 0.36 s without), and the terms left out are below one rounding.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from linstream.ops.decay.constants import flush_log
from linstream.ops.decay.numba import LOG_GATE_FLOOR
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

from .constants import DEFAULT_SSD_CHUNK
from .steps import time_steps

__all__ = ["BLOCK_COLUMNS", "DEFAULT_SSD_CHUNK", "ssd_chunks"]

# The heads of a group go to the threads in blocks of about this many columns (heads × P): the
# state's two products are then one matrix product per chunk and block ([n, N] @ [N, columns]
# and [columns, n] @ [n, N]), ~15% faster per FLOP than one per head at P = 64 (OpenBLAS, one
# thread), and 24 heads of 64 make 6 blocks, even on 2 threads.
BLOCK_COLUMNS = 256


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def _row_finite(x, b, c, step, i):  # pragma: no cover - jitted
    """Whether token i's x [H, P], B and C [G, N] and time steps [H, T] are all finite
    (v · 0 is 0 for a finite v and NaN otherwise; the sum vectorizes.  Not v − v: under
    FASTMATH's reassociation a sum of such terms may cancel to 0, as it did in the DPLR
    kernel's check)."""
    acc = 0.0
    for h in range(x.shape[1]):
        for p in range(x.shape[2]):
            acc += x[i, h, p] * 0.0
        acc += step[h, i] * 0.0
    for g in range(b.shape[1]):
        for q in range(b.shape[2]):
            acc += b[i, g, q] * 0.0 + c[i, g, q] * 0.0
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
    def run(x, b, c, step, a, d, s, out, starts, blocks, cb, flush):  # pragma: no cover
        """x [T, H, P], b, c [T, G, N], d [H, P] in the compute dtype (C-contiguous); step
        [H, T] and a [H] float64; s [H, P, N] the state, updated in place; out [T, H, P];
        starts the chunks' bounds; blocks [B, 2] the head blocks (first head, end), each
        within one group; cb [chunks, G, C·C] work (each chunk's CBᵀ per group); flush: the
        log decay below which a decay factor is 0 (`flush_log`)."""
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
        for bi in prange(blocks.shape[0]):
            h0, nk = blocks[bi, 0], blocks[bi, 1] - blocks[bi, 0]
            g = h0 // rep
            w = nk * dp  # the block's columns: its heads' P side by side
            la = np.empty(cmax, np.float64)
            gs = np.empty(cmax, np.float64)
            rs = np.empty(cmax, np.float64)
            seg = np.empty(cmax, np.float64)
            eg = np.empty(cmax, dt)
            sw = np.empty(cmax, dt)
            mmf = np.empty(cmax * cmax, dt)
            xc = np.empty((cmax, dp), dt)
            yi = np.empty((cmax, dp), dt)
            xd = np.empty((cmax, w), dt)
            ys = np.empty((cmax, w), dt)
            cg = np.empty((cmax, dn), dt)
            bc = np.empty((cmax, dn), dt)
            s0 = np.empty((w, dn), dt)
            upd = np.empty((w, dn), dt)
            decay = np.empty(nk, np.float64)
            for j in range(nk):  # S_0 in the compute dtype: then each chunk's new state's
                for p in range(dp):
                    for q in range(dn):
                        s0[j * dp + p, q] = s[h0 + j, p, q]
            for k in range(m):
                c0, n = starts[k], starts[k + 1] - starts[k]
                for i in range(n):
                    for q in range(dn):
                        cg[i, q] = c[c0 + i, g, q]
                        bc[i, q] = b[c0 + i, g, q]
                np.dot(cg[:n], s0.T, ys[:n])  # C S_0ᵀ of every head of the block
                mm = mmf[: n * n].reshape(n, n)
                for j in range(nk):
                    h = h0 + j
                    ah = a[h]
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
                        lg, lr = la0 + gs[i], rs[i]
                        eg[i] = dt.type(math.exp(lg)) if lg > flush else dt.type(0)
                        ek = dt.type(si * math.exp(lr)) if lr > flush else dt.type(0)
                        sw[i] = dt.type(si)
                        for p in range(dp):
                            v = x[c0 + i, h, p]
                            xc[i, p] = v
                            xd[i, j * dp + p] = v * ek
                    for i in range(n):
                        # row i of the segment sums G_i − G_j (j ≤ i): row i − 1's plus la_i,
                        # each one summed directly, from the segment's first step on
                        for jj in range(i):
                            seg[jj] += la[i]
                        seg[i] = 0.0
                        for jj in range(i + 1):
                            # times 1 or 0, not a branch: the loop vectorizes alike in the
                            # serial and the parallel version (the same bits); e^x ≥ 2^-126
                            keep = dt.type(seg[jj] > flush)
                            ev = exp(dt.type(seg[jj])) * keep
                            mm[i, jj] = cb[k, g, i * n + jj] * ev * sw[jj]
                        for jj in range(i + 1, n):
                            mm[i, jj] = 0
                    np.dot(mm, xc[:n], yi[:n])
                    for i in range(n):
                        e = eg[i]
                        for p in range(dp):
                            out[c0 + i, h, p] = (
                                ys[i, j * dp + p] * e + yi[i, p] + d[h, p] * xc[i, p]
                            )
                    decay[j] = math.exp(la0 + gn) if la0 + gn > flush else 0.0
                np.dot(xd[:n].T, bc[:n], upd)  # [w, N]: the block's heads' updates
                for j in range(nk):  # one pass over the state: S_n, and S_n for the next chunk
                    e = decay[j]
                    for p in range(dp):
                        for q in range(dn):
                            v = s[h0 + j, p, q] * e + upd[j * dp + p, q]
                            s[h0 + j, p, q] = v
                            s0[j * dp + p, q] = v

    return run


def _head_blocks(g: int, h: int, p: int) -> np.ndarray:
    """The head blocks [B, 2] (first head, end): each group's heads in blocks of
    BLOCK_COLUMNS // P heads (at least one), the last one shorter; fixed by the shapes alone."""
    per = max(1, BLOCK_COLUMNS // max(1, p))
    rep = h // g
    out = [
        (gi * rep + a, gi * rep + min(a + per, rep)) for gi in range(g) for a in range(0, rep, per)
    ]
    return np.array(out, dtype=np.int64).reshape(-1, 2)


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
    blocks = _head_blocks(g, h, p)
    flush = flush_log(ct, state.dtype)
    _SSD[worth_threads(work)](x, b, c, step, av, dd, state, out, starts, blocks, cb, flush)
    return out
