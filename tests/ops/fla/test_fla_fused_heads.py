"""The head-major passes (`fused_heads.head_major`, `conv_heads`) give the bits of the passes they
replace: NumPy's copy of the transposed view, and the short convolution followed by the
head-major copy or by `l2_heads`; whichever version runs (serial, parallel on one thread or
two) gives the same bits; and `pieces.short_conv` with heads returns the new tail as without."""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops.model.fla import fused, fused_heads, pieces
from linstream.ops.numba_tools import only_version

SEED = 20261205
DTYPES = [np.float32, np.float64]


def _numpy_head_major(x, d, repeat=1):
    t = x.shape[0]
    h = np.ascontiguousarray(x.reshape(t, -1, d).transpose(1, 0, 2))
    return np.repeat(h, repeat, axis=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("repeat", [1, 3])
@pytest.mark.parametrize("t", [1, 5, 700])
def test_head_major_is_numpy_s_copy_of_the_transposed_view(dtype, repeat, t):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED + t)
    product = rng.standard_normal((t, 3 * 96 + 12)).astype(dtype)
    for x in (product[:, 96 : 2 * 96], np.ascontiguousarray(product[:, :96])):  # a column slice
        for d in (32, 96):
            for parallel in (False, True):
                with only_version(parallel):
                    got = pieces.head_major(x, d, repeat)
                assert got.flags.c_contiguous and got.dtype == dtype
                np.testing.assert_array_equal(got, _numpy_head_major(x, d, repeat))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [2, 4, 5])
@pytest.mark.parametrize("t", [1, 3, 4, 200])
def test_conv_heads_is_the_convolution_then_its_heads(dtype, width, t):
    """The convolution written head-major is `fused.short_conv` then NumPy's head-major copy,
    and L2-normalized it is `fused.short_conv` then `fused.l2_heads`: the same bits, serial and
    parallel, with the same new tail."""
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED + 10 * t + width)
    heads, d = 3, 32
    x = rng.standard_normal((t, heads * d)).astype(dtype)
    tail = rng.standard_normal((width - 1, heads * d)).astype(dtype)
    w = rng.standard_normal((heads * d, width)).astype(dtype)
    scale = d**-0.5
    for silu in (False, True):
        rows, want_tail = fused.short_conv(x, tail, w, silu)
        for l2 in (None, scale, 1.0):
            hm = _numpy_head_major(rows, d)
            want = hm if l2 is None else fused.l2_heads(rows, d, 1e-6, l2)
            for parallel in (False, True):
                with only_version(parallel):
                    got, new_tail = pieces.short_conv(x, tail, w, silu, d, l2)
                assert got.shape == (heads, t, d) and got.dtype == dtype
                assert got.flags.c_contiguous
                np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(new_tail, want_tail)


def test_conv_heads_on_numpy_is_the_same_computation():
    """The NumPy path (a device's, here with NumPy as its namespace) of the head-major and L2
    variants: the convolution within (W + 9) roundings of its terms (as the fused test's
    bound), then the layout; the L2 variant's heads have unit norm times the scale."""
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, heads, d, width = 50, 2, 16, 4
    x = rng.standard_normal((t, heads * d)).astype(np.float32)
    tail = rng.standard_normal((width - 1, heads * d)).astype(np.float32)
    w = rng.standard_normal((heads * d, width)).astype(np.float32)
    host, _ = pieces.short_conv(x, tail, w, False, d)
    dev, dev_tail = pieces.short_conv(x, tail, w, False, d, xp=np)
    full = np.concatenate([tail, x]).astype(np.float64)
    terms = sum(np.abs(w[:, j]) * np.abs(full[j : j + t]) for j in range(width))
    u = float(np.finfo(np.float32).eps) / 2
    assert np.all(np.abs(host - dev) <= 2 * (width + 9) * u * _numpy_head_major(terms, d))
    np.testing.assert_array_equal(dev_tail, full[-(width - 1) :].astype(np.float32))
    normed, _ = pieces.short_conv(x, tail, w, True, d, 0.5, xp=np)
    norms = np.sqrt((normed.astype(np.float64) ** 2).sum(-1))
    assert np.all(np.abs(norms - 0.5) <= (d + 8) * u)


def test_the_thread_count_changes_no_bit():
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((300, 64)).astype(np.float32)
    tail = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal((64, 4)).astype(np.float32)
    outs = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            with only_version(True):
                outs.append(
                    [
                        fused_heads.conv_heads(x, tail, w, True, 16, True, 0.25, 1e-6),
                        fused_heads.head_major(x, 16, 2),
                    ]
                )
    finally:
        numba.set_num_threads(before)
    for one, two in zip(*outs, strict=True):
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 7, 300])
def test_rotary_heads_is_numpy_s_rotation_scaling_and_copy(dtype, t):
    """RetNet's q and k: `pieces.rotary` (NumPy), times the scale, then NumPy's head-major copy
    with each head repeated; the fused pass gives their bits, serial and parallel, from a column
    slice of a product as from a contiguous array, at positions far into a stream."""
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED + t)
    heads, d = 3, 16
    product = rng.standard_normal((t, 2 * heads * d + 5)).astype(dtype)
    cos, sin = pieces.rotary_tables(d, 10**9, t, dtype)
    for x in (product[:, heads * d : 2 * heads * d], np.ascontiguousarray(product[:, : heads * d])):
        for scale, repeat in ((d**-0.5, 1), (None, 2)):
            y = pieces.rotary(x.reshape(t, heads, d), cos, sin)
            if scale is not None:
                y *= dtype(scale)
            want = _numpy_head_major(y.reshape(t, -1), d, repeat)
            for parallel in (False, True):
                with only_version(parallel):
                    got = pieces.rotary_heads(x, cos, sin, d, scale, repeat)
                assert got.shape == (heads * repeat, t, d) and got.flags.c_contiguous
                np.testing.assert_array_equal(got, want)
