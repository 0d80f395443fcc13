"""Fused Numba passes for the fla runtime's elementwise and per-row steps (activations, norms,
gates) on [T, D] arrays (float32 or float64): one pass where NumPy takes several (its tanh form
of the sigmoid alone takes four).

    swiglu(gate, up)      silu(gate) · up, a new C-contiguous array
    silu(x)               x · sigmoid(x), a new C-contiguous array
    short_conv(x, tail, w, silu)   the depthwise causal convolution of `pieces.short_conv`
    conv(x, tail, w, bias, silu)   the same with a bias, the new tail left to the caller (Mamba-2's
                          keeps the old tail's dtype: `mamba2_passes.conv_silu`)
    rms_norm(x, w, eps)   x / sqrt(mean(x²) + eps) · w over the rows of x [T, D]
    add_rms_norm(x, a, w, eps)     (h = x + a, rms_norm(h, w, eps)): the residual and the next
                          norm in one pass, both new C-contiguous arrays
    head_norm(o, w, eps, gate)     rms_norm over each head's d of o [T, H, d] (any strides: the
                          recurrence's head-major output seen as [T, H, d]), times silu(gate)
                          when a gate is given; a new C-contiguous [T, H, d], so the output
                          projection reads it as [T, H·d] without a copy
    l2_heads(x, d, eps, scale)     x [T, H·d] L2-normalized per head (x / sqrt(Σx² + eps)),
                          times scale, written head-major [H, T, d]: DeltaNet's q and k
    log_gate(z, b, normalizer, clamp, d, repeat)   max(logsigmoid(z + b) / normalizer, clamp)
                          of z [T, K], written head-major [K/d · repeat, T, d] (each head
                          `repeat` times in a row): GLA's gate in one pass instead of seven

sigmoid(x) = 1 / (1 + e^−x) with `linstream.ops.numba_tools.exp` (the vectorizable float32
polynomial, clamped so e^−x stays finite; libm for float64, where e^−x = inf gives x/inf = −0,
the limit).  Measured on the ~100M-parameter GLA of tests/bench/test_bench_fla.py: the MLP's
SwiGLU over [2048, 2048] took ~0.1 s a layer in NumPy; on DeltaNet ~110M the short convolutions
(three per layer, [2048, 768] each, width 4, then SiLU) took as long as the recurrence in NumPy
(a pass per tap, a concatenation, four passes for SiLU), 13x less as one pass here.  Rows go to
Numba's threads from 2^18 elements on (`worth_threads`, as the runtime's other kernels); every
output element (every row of a norm: its sum of squares in the row's own order) is computed on
its own, so the bits do not depend on the threads.

The norms compute as `pieces`' NumPy expressions do, in the array's dtype: the row's sum of
squares (reassociated, as einsum's), its mean plus eps, one reciprocal square root, then
x · r · w; logsigmoid(v) = min(v, 0) − log1p(e^−|v|).  Measured in the ~110M GLA's float32
forward at 2,048 tokens (`helpers.fla_profile`): NumPy's gate (logsigmoid, bias, division, copy
to head-major) took 5% of the time, the block and head norms 4% (plus a hidden copy of the
head-major output for the output projection).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import njit, prange
from numba.core import types as nbtypes
from numba.extending import overload

from .bf16_round import BF16, written

__all__ = [
    "add_rms_norm",
    "conv",
    "conv_row4",
    "conv_tail",
    "head_norm",
    "log_gate",
    "rms_norm",
    "short_conv",
    "silu",
    "swiglu",
    "write_heads",
]

_WORK_PER_ELEMENT = 16  # as ops/model/kernels.py: a parallel region from 2^18 elements


def _swiglu_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(g, u, out):  # pragma: no cover - compiled
        one = g.dtype.type(1)
        for i in prange(g.shape[0]):
            for j in range(g.shape[1]):
                x = g[i, j]
                out[i, j] = written(out, x * u[i, j] / (one + exp(-x)))

    return run


def _silu_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, out):  # pragma: no cover - compiled
        one = x.dtype.type(1)
        for i in prange(x.shape[0]):
            for j in range(x.shape[1]):
                v = x[i, j]
                out[i, j] = v / (one + exp(-v))

    return run


@njit(nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _conv_row(x, head, wt, bias, silu, t, row):  # pragma: no cover - compiled
    """row = bias + Σ_j wt[j] · x[t + j − (W−1)] (rows before the chunk read from head), SiLU'd
    if silu."""
    n = wt.shape[0] - 1
    for d in range(x.shape[1]):
        row[d] = bias[d]
    for j in range(n + 1):
        s = t + j - n
        src = x[s] if s >= 0 else head[n + s]
        wj = wt[j]
        for d in range(x.shape[1]):
            row[d] += wj[d] * src[d]
    if silu:
        one = x.dtype.type(1)
        for d in range(x.shape[1]):
            v = row[d]
            row[d] = v / (one + exp(-v))


@njit(nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def conv_row4(a, b, c, e, w0, w1, w2, w3, bias, silu, row):  # pragma: no cover - compiled
    """`_conv_row` at width 4 within the chunk: row = bias + w0·a + w1·b + w2·c + w3·e (a the
    oldest input row), SiLU'd if silu, as one vector loop (the same sum in the same order: the
    same bits; 1.2-1.5x faster than a loop per tap, 2,048 × 768 and 2,048 × 1,792 on 2
    threads)."""
    if silu:
        one = row.dtype.type(1)
        for d in range(row.shape[0]):
            v = bias[d] + w0[d] * a[d] + w1[d] * b[d] + w2[d] * c[d] + w3[d] * e[d]
            row[d] = v / (one + exp(-v))
    else:
        for d in range(row.shape[0]):
            row[d] = bias[d] + w0[d] * a[d] + w1[d] * b[d] + w2[d] * c[d] + w3[d] * e[d]


def _conv_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, head, wt, bias, silu, out):  # pragma: no cover - compiled
        # out[t] = bias + Σ_j wt[j] · x[t + j − (W−1)], rows before the chunk read from head
        # [W−1, D]; a bias of zeros adds nothing (0 + v is v), so no bias costs no other bits
        if wt.shape[0] != 4:
            for t in prange(x.shape[0]):
                _conv_row(x, head, wt, bias, silu, t, out[t])
            return
        # width 4 (fla's default, Mamba-2's): the first rows read the tail; then every tap is
        # within the chunk (`conv_row4`)
        first = min(3, x.shape[0])
        for t in range(first):
            _conv_row(x, head, wt, bias, silu, t, out[t])
        w0, w1, w2, w3 = wt[0], wt[1], wt[2], wt[3]
        for t in prange(first, x.shape[0]):
            conv_row4(x[t - 3], x[t - 2], x[t - 1], x[t], w0, w1, w2, w3, bias, silu, out[t])

    return run


def _rms_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, w, eps, out):  # pragma: no cover - compiled
        one = x.dtype.type(1)
        n = x.dtype.type(x.shape[1])
        for i in prange(x.shape[0]):
            ss = x.dtype.type(0)
            for j in range(x.shape[1]):
                v = x[i, j]
                ss += v * v
            r = one / math.sqrt(ss / n + eps)
            for j in range(x.shape[1]):
                out[i, j] = x[i, j] * r * w[j]

    return run


def _add_rms_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, a, w, eps, h, out):  # pragma: no cover - compiled
        one = x.dtype.type(1)
        n = x.dtype.type(x.shape[1])
        for i in prange(x.shape[0]):
            ss = x.dtype.type(0)
            for j in range(x.shape[1]):
                v = x[i, j] + a[i, j]
                h[i, j] = v
                ss += v * v
            r = one / math.sqrt(ss / n + eps)
            for j in range(x.shape[1]):
                out[i, j] = written(out, h[i, j] * r * w[j])

    return run


def _head_norm_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(o, w, eps, gate, gated, out):  # pragma: no cover - compiled
        # o: head-major [H, T, d], C-contiguous; gate, out: [T, H, d]
        one = o.dtype.type(1)
        d = o.shape[2]
        n = o.dtype.type(d)
        for t in prange(o.shape[1]):
            for h in range(o.shape[0]):
                x = o[h, t]
                ss = o.dtype.type(0)
                for j in range(d):
                    ss += x[j] * x[j]
                r = one / math.sqrt(ss / n + eps)
                row = out[t, h]
                if gated:
                    g = gate[t, h]
                    for j in range(d):
                        row[j] = x[j] * r * w[j] * (g[j] / (one + exp(-g[j])))
                else:
                    for j in range(d):
                        row[j] = x[j] * r * w[j]

    return run


#: write_heads' flags: FASTMATH without reassociation, so that its sums have one order wherever
#: it is called from (with reassoc, LLVM's vectorizer chose the sum of squares' order per caller:
#: `fused_heads.conv_heads` and `l2_heads` differed in the last bits on a Zen 4)
_ORDERED = FASTMATH - {"reassoc"}


@njit(nogil=True, fastmath=_ORDERED, error_model="numpy")
def write_heads(row, t, l2, eps, scale, out):  # pragma: no cover - compiled
    """row [H·d] into out[:, t] (head-major), each head L2-normalized times scale if l2 (its
    sum of squares in eight running sums, j mod 8, added pairwise: one order, any caller)."""
    one = row.dtype.type(1)
    zero = row.dtype.type(0)
    d = out.shape[2]
    for h in range(out.shape[0]):
        src = row[h * d : (h + 1) * d]
        dst = out[h, t]
        if l2:
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
            j = 0
            while j + 8 <= d:
                s0 += src[j] * src[j]
                s1 += src[j + 1] * src[j + 1]
                s2 += src[j + 2] * src[j + 2]
                s3 += src[j + 3] * src[j + 3]
                s4 += src[j + 4] * src[j + 4]
                s5 += src[j + 5] * src[j + 5]
                s6 += src[j + 6] * src[j + 6]
                s7 += src[j + 7] * src[j + 7]
                j += 8
            while j < d:
                s0 += src[j] * src[j]
                j += 1
            ss = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
            r = one / math.sqrt(ss + eps)
            for j in range(d):
                dst[j] = src[j] * r * scale
        else:
            for j in range(d):
                dst[j] = src[j]


def _l2_heads_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, eps, scale, out):  # pragma: no cover - compiled
        # out[h, t] = x[t, h·d : (h+1)·d] / sqrt(Σ² + eps) · scale
        for t in prange(x.shape[0]):
            write_heads(x[t], t, True, eps, scale, out)

    return run


def _log1p_small(u: float) -> float:
    """log1p(u) for 0 ≤ u ≤ 1 in u's precision.  float32: vectorizable, 2·atanh(s) with
    s = u / (2 + u) ≤ 1/3 by its series to s^15 (the rest below 2e-9 relative, under float32's
    roundoff; exact near 0, where log(1 + u) is not); float64: libm's log1p."""
    return math.log1p(u)


def _series(f: Any) -> Any:
    def impl(u):  # pragma: no cover - compiled
        s = u / (f(2) + u)
        s2 = s * s
        p = s2 * f(1 / 15) + f(1 / 13)
        p = p * s2 + f(1 / 11)
        p = p * s2 + f(1 / 9)
        p = p * s2 + f(1 / 7)
        p = p * s2 + f(1 / 5)
        p = p * s2 + f(1 / 3)
        p = p * s2 + f(1)
        return f(2) * s * p

    return impl


@overload(_log1p_small, jit_options={"nogil": True, "fastmath": FASTMATH})
def _log1p_small_overload(u):  # unannotated, as numba_tools' exp overload
    if u == nbtypes.float32:
        return _series(np.float32)
    return lambda u: math.log1p(u)  # float64: libm (the series stops at float32's precision)


def _log_gate_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(z, b, normalizer, clamp, repeat, out):  # pragma: no cover - compiled
        zero = z.dtype.type(0)
        d = out.shape[2]
        for t in prange(z.shape[0]):
            for head in range(z.shape[1] // d):
                row = out[head * repeat, t]
                for j in range(d):
                    v = z[t, head * d + j] + b[head * d + j]
                    m = v if v < zero else zero
                    g = (m - _log1p_small(exp(-abs(v)))) / normalizer
                    row[j] = clamp if g < clamp else g
                for r in range(1, repeat):
                    out[head * repeat + r, t, :] = row

    return run


_RMS = {p: _rms_kernel(p) for p in (False, True)}
_ADD_RMS = {p: _add_rms_kernel(p) for p in (False, True)}
_HEAD_NORM = {p: _head_norm_kernel(p) for p in (False, True)}
_L2_HEADS = {p: _l2_heads_kernel(p) for p in (False, True)}
_LOG_GATE = {p: _log_gate_kernel(p) for p in (False, True)}
_SWIGLU = {p: _swiglu_kernel(p) for p in (False, True)}
_SILU = {p: _silu_kernel(p) for p in (False, True)}
_CONV = {p: _conv_kernel(p) for p in (False, True)}


def swiglu(gate: np.ndarray, up: np.ndarray, rounded: bool = False) -> np.ndarray:
    """silu(gate) · up for [T, D] arrays of one float dtype; rounded (float32): written rounded
    to bfloat16 (`bf16_round.bf16_bits`), as the bfloat16 products take it."""
    parallel = worth_threads(gate.size * _WORK_PER_ELEMENT)
    if rounded and gate.dtype == np.float32:
        bits = np.empty(gate.shape, dtype=np.uint16)
        _SWIGLU[parallel](gate, up, bits)
        return bits.view(BF16)
    out = np.empty(gate.shape, dtype=gate.dtype)
    _SWIGLU[parallel](gate, up, out)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x) for a [T, D] float array."""
    out = np.empty(x.shape, dtype=x.dtype)
    _SILU[worth_threads(x.size * _WORK_PER_ELEMENT)](x, out)
    return out


def conv(
    x: np.ndarray, tail: np.ndarray, w: np.ndarray, bias: np.ndarray | None, silu_after: bool
) -> np.ndarray:
    """bias + the depthwise causal convolution of width W over x [T, D] (float32 or float64;
    rows of any stride, but a strided view's loops vectorize worse, so `mamba2_passes` copies its
    view of the in-projection first), its first rows reading tail [W−1, D] (any float dtype:
    the raw inputs before the chunk), w [D, W] the newest input meeting w[:, W−1], bias [D] or
    None; SiLU'd if silu_after.  A new C-contiguous [T, D] in x's dtype."""
    head = np.ascontiguousarray(tail, dtype=x.dtype)
    wt = np.ascontiguousarray(w.T, dtype=x.dtype)
    b = np.zeros(x.shape[1], x.dtype) if bias is None else np.asarray(bias, dtype=x.dtype)
    out = np.empty(x.shape, dtype=x.dtype)
    _CONV[worth_threads(x.size * w.shape[1] * 4)](x, head, wt, b, bool(silu_after), out)
    return out


def short_conv(
    x: np.ndarray, tail: np.ndarray, w: np.ndarray, silu_after: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`pieces.short_conv` in one pass (`conv` without a bias): x [T, D] (float32 or float64),
    tail [W−1, D] (any float dtype), w [D, W]; returns (y [T, D] in x's dtype, the new tail in
    tail's dtype)."""
    return conv(x, tail, w, None, silu_after), conv_tail(x, tail, w.shape[1] - 1)


def conv_tail(x: np.ndarray, tail: np.ndarray, n: int) -> np.ndarray:
    """The last n raw inputs after x [T, D] (`short_conv`'s new tail), in tail's dtype: x's own
    or, for a chunk shorter than n, partly the old tail's [n, D]."""
    t = x.shape[0]
    if t >= n:
        new_tail = np.array(x[t - n :], dtype=tail.dtype)
    else:  # as pieces': the old tail's rows through x's dtype
        head = np.asarray(tail, dtype=x.dtype)
        new_tail = np.concatenate([head[t:], x], axis=0).astype(tail.dtype)
    return new_tail


def _weight(w: np.ndarray | None, d: int, dtype: Any) -> np.ndarray:
    # no weight: ones (x · 1 is x, bit for bit)
    return np.ones(d, dtype) if w is None else np.ascontiguousarray(w, dtype=dtype)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · w over the rows of x [T, D] (float32 or float64), w [D] or
    None; a new C-contiguous array."""
    out = np.empty(x.shape, dtype=x.dtype)
    ww = _weight(w, x.shape[1], x.dtype)
    _RMS[worth_threads(x.size * _WORK_PER_ELEMENT)](x, ww, x.dtype.type(eps), out)
    return out


def add_rms_norm(
    x: np.ndarray, a: np.ndarray, w: np.ndarray | None, eps: float, rounded: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(h = x + a, rms_norm(h, w, eps)) for x, a [T, D] of one float dtype; rounded (float32):
    the norm written rounded to bfloat16, as the bfloat16 products take it."""
    h = np.empty(x.shape, dtype=x.dtype)
    ww = _weight(w, x.shape[1], x.dtype)
    parallel = worth_threads(x.size * _WORK_PER_ELEMENT)
    if rounded and x.dtype == np.float32:
        bits = np.empty(x.shape, dtype=np.uint16)
        _ADD_RMS[parallel](x, a, ww, x.dtype.type(eps), h, bits)
        return h, bits.view(BF16)
    out = np.empty(x.shape, dtype=x.dtype)
    _ADD_RMS[parallel](x, a, ww, x.dtype.type(eps), h, out)
    return h, out


def head_norm(
    o: np.ndarray, w: np.ndarray | None, eps: float, gate: np.ndarray | None
) -> np.ndarray:
    """rms_norm over each head's d of o [T, H, d], times silu(gate [T, H, d]) if given."""
    d = o.shape[2]
    out = np.empty(o.shape, dtype=o.dtype)
    ww = _weight(w, d, o.dtype)
    heads = o.transpose(1, 0, 2)  # the recurrence's own [H, T, d]: no copy
    heads = heads if heads.flags.c_contiguous else np.ascontiguousarray(heads)
    g = out if gate is None else np.ascontiguousarray(gate)  # not read without a gate
    run = _HEAD_NORM[worth_threads(o.size * _WORK_PER_ELEMENT)]
    run(heads, ww, o.dtype.type(eps), g, gate is not None, out)
    return out


def log_gate(
    z: np.ndarray, b: np.ndarray, normalizer: float, clamp: float | None, d: int, repeat: int = 1
) -> np.ndarray:
    """max(logsigmoid(z + b) / normalizer, clamp) of z [T, K] (b [K]; clamp None: none),
    head-major [K/d · repeat, T, d], head i of it from head i // repeat of z."""
    t, k = z.shape
    out = np.empty((k // d * repeat, t, d), dtype=z.dtype)
    low = -math.inf if clamp is None else clamp
    bb = np.ascontiguousarray(b, dtype=z.dtype)
    run = _LOG_GATE[worth_threads(z.size * repeat * _WORK_PER_ELEMENT)]
    run(z, bb, z.dtype.type(normalizer), z.dtype.type(low), repeat, out)
    return out


def l2_heads(x: np.ndarray, d: int, eps: float, scale: float) -> np.ndarray:
    """x [T, H·d] (C-contiguous rows) L2-normalized per head of d, times scale, head-major
    [H, T, d]."""
    t = x.shape[0]
    out = np.empty((x.shape[1] // d, t, d), dtype=x.dtype)
    xx = np.ascontiguousarray(x)
    run = _L2_HEADS[worth_threads(x.size * _WORK_PER_ELEMENT)]
    run(xx, x.dtype.type(eps), x.dtype.type(scale), out)
    return out
