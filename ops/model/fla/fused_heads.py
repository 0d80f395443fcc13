"""Fused Numba passes that write head-major [H, T, d] arrays, the recurrence kernels' layout, from
row-major [T, H·d] ones: the copy itself, and DeltaNet's short convolutions and RetNet's rotary
embedding writing their heads.

    head_major(x, d, repeat)        the layout of `pieces.head_major` (a new contiguous
                                    [H·repeat, T, d], each head `repeat` times in a row)
    conv_heads(x, tail, w, silu, d, l2, scale, eps)   `fused.conv` without a bias, each row
                                    then written head-major; with l2 each head's row divided
                                    by sqrt(Σ² + eps) and times scale, as `fused.l2_heads`
    rotary_heads(x, cos, sin, d, scale, repeat)   `pieces.rotary` of each head, times scale,
                                    head-major (each value rounded as NumPy rounds it apart)

A projection's output at 2,048 tokens is several MiB, gone from the core's cache when the next
pass reads it.  NumPy's copy of its transposed view runs on one thread; here rows go to Numba's
threads (`worth_threads`, as `fused`'s): GLA ~110M's q, k and v copies took 29 ms of a
2,048-token float32 chunk, 14 ms here (`helpers.fla_profile`).  DeltaNet's q, k and v went
through two passes each, the convolution (SiLU in it) and then `fused.l2_heads` or the copy,
each a round trip of a [T, D] array; `conv_heads` is one, every row convolved into a buffer of
its thread's and written out from there: 58 ms of DeltaNet ~110M's chunk before, 35 ms here.
RetNet's q and k were rotated in NumPy (a product per term, then a concatenation), scaled, and
copied head-major: the rotation alone took 124 ms of RetNet ~110M's 2,048-token float32 chunk,
all three 14 ms in `rotary_heads`.

A row is computed by the functions the passes it replaces run (`fused.conv_row4` and
`_conv_row`, then `fused.write_heads`, `fused.l2_heads`' own): the same bits, tested against
them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.numba_tools import FASTMATH, njit_variant, worth_threads
from numba import prange

from .fused import _WORK_PER_ELEMENT, _conv_row, conv_row4, write_heads

__all__ = ["conv_heads", "head_major", "rotary_heads"]

_TASKS = 16  # `conv_heads`' parallel tasks (rows T/16 each, one buffer each)


def _head_major_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, error_model="numpy")
    def run(x, repeat, out):  # pragma: no cover - compiled
        # out[h·repeat + r, t] = x[t, h·d : (h+1)·d]
        d = out.shape[2]
        for t in prange(x.shape[0]):
            for h in range(x.shape[1] // d):
                for r in range(repeat):
                    row = out[h * repeat + r, t]
                    for j in range(d):
                        row[j] = x[t, h * d + j]

    return run


def _conv_heads_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(x, head, wt, silu, l2, eps, scale, out):  # pragma: no cover - compiled
        t_all, dim = x.shape
        bias = np.zeros(dim, x.dtype)  # no bias: 0 + v is v, as fused.conv's
        step = (t_all + _TASKS - 1) // _TASKS
        for task in prange(_TASKS):
            row = np.empty(dim, x.dtype)  # the task's row, convolved here, then written out
            for t in range(task * step, min((task + 1) * step, t_all)):
                if wt.shape[0] == 4 and t >= 3:
                    a, b, c, e = x[t - 3], x[t - 2], x[t - 1], x[t]
                    conv_row4(a, b, c, e, wt[0], wt[1], wt[2], wt[3], bias, silu, row)
                else:  # the rows reading the tail, and every row at another width
                    _conv_row(x, head, wt, bias, silu, t, row)
                write_heads(row, t, l2, eps, scale, out)

    return run


def _rotary_heads_kernel(parallel: bool) -> Any:
    # no fastmath: NumPy's roundings (each product and sum rounded, no fused multiply-add)
    @njit_variant(parallel, nogil=True, error_model="numpy")
    def run(x, cos, sin, scale, scaled, repeat, out):  # pragma: no cover - compiled
        # out[h·repeat + r, t] = [x1·cos − x2·sin, x2·cos + x1·sin] (· scale) of head h at t
        d = out.shape[2]
        half = d // 2
        for t in prange(x.shape[0]):
            c, s = cos[t], sin[t]
            for h in range(x.shape[1] // d):
                src = x[t, h * d : (h + 1) * d]
                dst = out[h * repeat, t]
                for j in range(half):
                    a = src[j] * c[j] - src[half + j] * s[j]
                    b = src[half + j] * c[j] + src[j] * s[j]
                    if scaled:
                        a = a * scale
                        b = b * scale
                    dst[j] = a
                    dst[half + j] = b
                for r in range(1, repeat):
                    out[h * repeat + r, t, :] = dst

    return run


_HEAD_MAJOR = {p: _head_major_kernel(p) for p in (False, True)}
_ROTARY_HEADS = {p: _rotary_heads_kernel(p) for p in (False, True)}
_CONV_HEADS = {p: _conv_heads_kernel(p) for p in (False, True)}


def head_major(x: np.ndarray, d: int, repeat: int = 1) -> np.ndarray:
    """x [T, n·d] (any row stride: a column slice of a product) -> a new contiguous
    [n·repeat, T, d], head i of it head i // repeat of x."""
    out = np.empty((x.shape[1] // d * repeat, x.shape[0], d), dtype=x.dtype)
    _HEAD_MAJOR[worth_threads(out.size * _WORK_PER_ELEMENT)](x, repeat, out)
    return out


def conv_heads(
    x: np.ndarray,
    tail: np.ndarray,
    w: np.ndarray,
    silu_after: bool,
    d: int,
    l2: bool,
    scale: float,
    eps: float,
) -> np.ndarray:
    """`fused.conv(x, tail, w, None, silu_after)` written head-major [D/d, T, d]; with l2 each
    head L2-normalized (x / sqrt(Σx² + eps)) and times scale, as `fused.l2_heads`.  x [T, D]
    float32 or float64, tail [W−1, D] (any float dtype), w [D, W].  The new tail is the
    caller's (`fused.short_conv`'s)."""
    head = np.ascontiguousarray(tail, dtype=x.dtype)
    wt = np.ascontiguousarray(w.T, dtype=x.dtype)
    out = np.empty((x.shape[1] // d, x.shape[0], d), dtype=x.dtype)
    f = x.dtype.type
    run = _CONV_HEADS[worth_threads(x.size * w.shape[1] * 4)]
    run(x, head, wt, bool(silu_after), bool(l2), f(eps), f(scale), out)
    return out


def rotary_heads(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, d: int, scale: float | None, repeat: int
) -> np.ndarray:
    """`pieces.rotary` of x [T, H·d] (heads of d; any row stride) by cos, sin [T, d/2] in x's
    dtype, times scale unless None, written head-major [H·repeat, T, d] (`head_major`'s
    layout): the rotation, the scaling and the copy in one pass, each value rounded as NumPy
    rounds them apart (tested: the same bits)."""
    out = np.empty((x.shape[1] // d * repeat, x.shape[0], d), dtype=x.dtype)
    f = x.dtype.type
    c, s = (np.ascontiguousarray(a, dtype=x.dtype) for a in (cos, sin))
    run = _ROTARY_HEADS[worth_threads(out.size * _WORK_PER_ELEMENT)]
    run(x, c, s, f(1.0 if scale is None else scale), scale is not None, repeat, out)
    return out
