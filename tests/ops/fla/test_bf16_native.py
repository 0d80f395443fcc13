"""The AVX512-BF16 kernel (`bf16_native`: bfloat16 products, float32 accumulation, the weights
packed once) as the bfloat16 mode meets it: each product within the rounding bound of the exact
product of its bfloat16 operands, whatever the shape's tails (rows past a tile of 8, columns past
a panel of 48, an odd or empty k, a range of an output's columns), the same bits for any split of
the rows (so a forward's bits do not depend on the thread count), the engine `auto` picks on a
CPU with AVX512_BF16 and no AMX, and one line where it cannot run.

Tolerance: the kernel sums the exact products x_j·w_j (two bfloat16 significands fit a float32's)
in float32, in pairs, in its own order; a float32 dot product of length k in any order is within
γ_k · Σ_j |x_j w_j| of the exact one, γ_k = k·u / (1 − k·u), u = 2⁻²⁴ (Higham's bound).  The
instruction counts values below float32's normal range as zero; the operands here are normal.
A wrong tile (a row's pair skipped: off by |x_j w_j| ≈ 1 against a bound of ~1e-4) fails it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.ops.model.fla import bf16, bf16_native
from linstream.ops.model.fla.bf16 import ENV, BF16Unavailable, choose_engine

BF16 = np.dtype(ml_dtypes.bfloat16)
U = 2.0**-24
WHY = bf16_native.reason_unavailable()
needs_kernel = pytest.mark.skipif(WHY is not None, reason=f"the AVX512-BF16 kernel: {WHY}")


def _operands(rng, m, k, n):
    x = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    w = rng.standard_normal((n, k), dtype=np.float32).astype(BF16)
    return x, w


def _check(out, x, w):
    """out within Higham's bound of the exact product of x and wᵀ (float64 holds it exactly
    enough: its own error is 2⁻⁵³ · k of the same sum)."""
    k = x.shape[1]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    exact = x64 @ w64.T
    gamma = k * U / (1 - k * U) if k else 0.0
    bound = gamma * (np.abs(x64) @ np.abs(w64).T) * (1 + 1e-9)
    err = np.abs(out.astype(np.float64) - exact)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (worst, err[worst], bound[worst])


@needs_kernel
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(1, 768, 100), (8, 2, 48), (9, 7, 49), (13, 1, 47), (130, 768, 2304), (257, 2048, 97)],
)
def test_products_within_the_rounding_bound(m, k, n):
    rng = np.random.default_rng(m * 7919 + k * 31 + n)
    x, w = _operands(rng, m, k, n)
    ranges = [slice(0, n // 3), slice(n // 3, n)]  # two column ranges, as the runtime's
    out = np.full((m, n), np.nan, np.float32)
    packed = bf16_native.Packed(w, ranges)
    for j in range(len(ranges)):
        packed.rows(x, j, out)
    _check(out, x, w)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(0, 70),
    n=st.integers(1, 150),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_shape_within_the_bound_into_a_wider_output(m, k, n, seed):
    """A column range written into an output wider than it (its row stride is the output's),
    the columns beside it untouched."""
    print(f"seed={seed} m={m} k={k} n={n}")
    rng = np.random.default_rng(seed)
    x, w = _operands(rng, m, k, n)
    out = np.full((m, n + 5), -7.0, np.float32)
    bf16_native.Packed(w, [slice(0, n)]).rows(x, 0, out[:, 2 : 2 + n])
    _check(out[:, 2 : 2 + n], x, w)
    assert np.all(out[:, :2] == -7.0) and np.all(out[:, 2 + n :] == -7.0)


@needs_kernel
def test_the_bits_do_not_depend_on_how_the_rows_are_split():
    rng = np.random.default_rng(11)
    x, w = _operands(rng, 301, 768, 250)
    packed = bf16_native.Packed(w, [slice(0, 250)])
    whole = np.empty((301, 250), np.float32)
    packed.rows(x, 0, whole)
    for cut in (1, 7, 8, 129, 300):
        parts = np.empty_like(whole)
        packed.rows(x[:cut], 0, parts[:cut])
        packed.rows(x[cut:], 0, parts[cut:])
        np.testing.assert_array_equal(parts, whole)


@needs_kernel
def test_wrong_operands_are_one_line():
    w = np.ones((4, 6), BF16)
    packed = bf16_native.Packed(w, [slice(0, 4)])
    with pytest.raises(ValueError, match=r"expected x bfloat16 \[m, 6\]"):
        packed.rows(np.ones((2, 5), BF16), 0, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="expected a bfloat16"):
        bf16_native.Packed(np.ones((4, 6), np.float32), [slice(0, 4)])


@needs_kernel
def test_auto_picks_the_kernel_without_amx(monkeypatch):
    """On a CPU with AVX512_BF16 and no AMX the kernel (MKL's bfloat16 product ran at 0.3x its
    rate on a Zen 4 EPYC); with AMX, MKL where it is found."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(bf16, "native_bf16", lambda: "avx512_bf16")
    engine = choose_engine()
    assert engine.name == "avx512bf16" and engine.packs
    assert "AVX512-BF16 kernel" in engine.note
    monkeypatch.setattr(bf16, "native_bf16", lambda: "amx_bf16")
    try:
        bf16._mkl()
    except BF16Unavailable:
        return
    assert choose_engine().name == "mkl"


def test_the_kernel_asked_for_where_it_cannot_run_is_one_line(monkeypatch):
    monkeypatch.setattr(bf16_native, "reason_unavailable", lambda: "this CPU has no AVX512_BF16")
    with pytest.raises(BF16Unavailable) as info:
        choose_engine("avx512bf16")
    assert str(info.value) == f"{ENV}=avx512bf16: this CPU has no AVX512_BF16"
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(bf16, "native_bf16", lambda: "avx512_bf16")
    assert choose_engine().name != "avx512bf16"  # auto takes another engine
