"""The AVX-512 kernels (`avx512`: bfloat16 products with float32 accumulation on AVX512-BF16,
float32 products on AVX-512F, the weights packed once) as the modes meet them: each product
within the rounding bound of the exact product of its operands, whatever the shape's tails (rows
past a tile of 8, columns past a panel of 48, an odd or empty k, a range of an output's
columns), the same bits for any split of the rows (so a forward's bits do not depend on the
thread count), the engines `auto` picks (bfloat16: on a CPU with AVX512_BF16 and no AMX), and
one line where a kernel cannot run.

Tolerance: the kernels sum x_j·w_j in float32 in their own order (bfloat16: the exact products,
two 8-bit significands fit a float32's, in pairs; float32: each product fused into its sum); a
float32 dot product of length k in any order is within γ_k · Σ_j |x_j w_j| of the exact one,
γ_k = k·u / (1 − k·u), u = 2⁻²⁴ (Higham's bound; a fused multiply-add rounds once where a
multiply and an add round twice, inside the same bound).  The bfloat16 instruction counts
values below float32's normal range as zero; the operands here are normal.  A wrong tile (a
row's pair skipped: off by |x_j w_j| ≈ 1 against a bound of ~1e-4) fails it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.ops.model.fla import avx512, bf16, mkl
from linstream.ops.model.fla.bf16 import ENV, BF16Unavailable, choose_engine
from linstream.ops.model.fla.f32 import F32_ENV, choose_f32_products

BF16 = np.dtype(ml_dtypes.bfloat16)
U = 2.0**-24
DTYPES = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            avx512.reason_unavailable(name) is not None,
            reason=f"the {name} kernel: {avx512.reason_unavailable(name)}",
        ),
    )
    for name in ("bfloat16", "float32")
]
WHY = avx512.reason_unavailable()
needs_kernel = pytest.mark.skipif(WHY is not None, reason=f"the AVX512-BF16 kernel: {WHY}")


def _operands(rng, m, k, n, dtype="bfloat16"):
    dt = BF16 if dtype == "bfloat16" else np.dtype(np.float32)
    x = rng.standard_normal((m, k), dtype=np.float32).astype(dt)
    w = rng.standard_normal((n, k), dtype=np.float32).astype(dt)
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(1, 768, 100), (8, 2, 48), (9, 7, 49), (13, 1, 47), (130, 768, 2304), (257, 2048, 97)],
)
def test_products_within_the_rounding_bound(m, k, n, dtype):
    rng = np.random.default_rng(m * 7919 + k * 31 + n)
    x, w = _operands(rng, m, k, n, dtype)
    ranges = [slice(0, n // 3), slice(n // 3, n)]  # two column ranges, as the runtime's
    out = np.full((m, n), np.nan, np.float32)
    packed = avx512.Packed(w, ranges)
    for j in range(len(ranges)):
        packed.rows(x, j, out)
    _check(out, x, w)


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(0, 70),
    n=st.integers(1, 150),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_shape_within_the_bound_into_a_wider_output(dtype, m, k, n, seed):
    """A column range written into an output wider than it (its row stride is the output's),
    the columns beside it untouched."""
    print(f"seed={seed} m={m} k={k} n={n}")
    rng = np.random.default_rng(seed)
    x, w = _operands(rng, m, k, n, dtype)
    out = np.full((m, n + 5), -7.0, np.float32)
    avx512.Packed(w, [slice(0, n)]).rows(x, 0, out[:, 2 : 2 + n])
    _check(out[:, 2 : 2 + n], x, w)
    assert np.all(out[:, :2] == -7.0) and np.all(out[:, 2 + n :] == -7.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_bits_do_not_depend_on_how_the_rows_are_split(dtype):
    rng = np.random.default_rng(11)
    x, w = _operands(rng, 301, 768, 250, dtype)
    packed = avx512.Packed(w, [slice(0, 250)])
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
    packed = avx512.Packed(w, [slice(0, 4)])
    with pytest.raises(ValueError, match=r"expected x bfloat16 \[m, 6\]"):
        packed.rows(np.ones((2, 5), BF16), 0, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="expected a bfloat16 or float32"):
        avx512.Packed(np.ones((4, 6), np.float64), [slice(0, 4)])


@needs_kernel
def test_auto_picks_the_kernel_without_amx(monkeypatch):
    """On a CPU with AVX512_BF16 and no AMX the kernel (MKL's bfloat16 product ran at 0.29-0.45x
    its rate on a Zen 4 EPYC); with AMX, MKL where it is found."""
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
    monkeypatch.setattr(avx512, "reason_unavailable", lambda _="": "this CPU has no AVX512_BF16")
    with pytest.raises(BF16Unavailable) as info:
        choose_engine("avx512bf16")
    assert str(info.value) == f"{ENV}=avx512bf16: this CPU has no AVX512_BF16"
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(bf16, "native_bf16", lambda: "avx512_bf16")
    assert choose_engine().name != "avx512bf16"  # auto takes another engine


def test_the_float32_kernel_is_asked_for_by_name(monkeypatch):
    """LINSTREAM_F32_PRODUCTS=avx512: the kernel, its weights packed, the load's line says so;
    where it cannot run, one line."""
    if avx512.reason_unavailable("float32") is None:
        f32 = choose_f32_products("avx512")
        assert f32.name == "avx512" and f32.packs and "AVX-512 kernel" in f32.note
    monkeypatch.setattr(avx512, "reason_unavailable", lambda _="": "this CPU has no AVX-512")
    with pytest.raises(mkl.MKLUnavailable) as info:
        choose_f32_products("avx512")
    assert str(info.value) == f"{F32_ENV}=avx512: this CPU has no AVX-512"
