"""The array-namespace passes of RWKV-7 and Mamba-2 (`rwkv7_xp`, `mamba2_xp`: what the device
runtime runs) against the Numba passes they mirror (`rwkv7_passes`, `mamba2_passes`), with NumPy
as the namespace, on the inputs' views as the runtime hands them; and every namespace function
they call exists in CuPy (they run there unchanged).

Tolerance, derived per output element: both sides evaluate the same formula in the compute
dtype, in the same order, except the exponential (NumPy's vs `numba_tools.exp`, each ~1 ulp),
the order of the float64 sums (rounding ~2^-53, far below float32's) and the compute-dtype sums
(the RWKV-7 bonus Σ r ⊙ k ⊙ r_k, the convolution's taps).  So each side is within
n · u · S of the exact value, S the sum of the magnitudes of the terms the element is formed
from (or the element's own magnitude where every step is a product or a quotient: no
cancellation), n the roundings on the longest path (each bound names them); the two sides are
within twice that.  u is the dtype's unit roundoff.
"""

from __future__ import annotations

import ast
import inspect
import itertools

import numpy as np
import pytest
from linstream.ops.model.fla import mamba2_passes, mamba2_xp, rwkv7_passes, rwkv7_xp

SEED = 20261205
DTYPES = [np.float32, np.float64]


def unit(dtype) -> float:
    return float(np.finfo(dtype).eps) / 2


U64 = unit(np.float64)  # the float64 sums' roundoff (their order differs: n terms, n · U64)


def f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


def assert_within(got, want, per_side) -> None:
    """|got − want| ≤ 2 · per_side elementwise (each side within per_side of the exact value)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    err = np.abs(f64(got) - f64(want))
    bound = 2.0 * np.broadcast_to(per_side, err.shape)
    ratio = float((err / np.maximum(bound, np.finfo(np.float64).tiny)).max())
    print(f"worst error / bound = {ratio:.3g}")
    assert (err <= bound).all(), ratio


def columns(rng, t: int, widths: list[int], dtype, scale: float = 2.0) -> list[np.ndarray]:
    """Column ranges of one wider array (strided views, as a fused projection's outputs)."""
    wide = (scale * rng.standard_normal((t, sum(widths) + 3))).astype(dtype)
    bounds = np.cumsum([0, *widths])
    return [wide[:, a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_mix_equals_numba(dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, d = 33, 40
    [h] = columns(rng, t, [d], dtype)
    last = rng.standard_normal(d)  # the carried state, float64
    mix = rng.uniform(-0.5, 1.5, (6, d)).astype(dtype)
    got = rwkv7_xp.shift_mix(np, h, last, mix)
    want = rwkv7_passes.shift_mix(np.ascontiguousarray(h), last, mix)
    prev = np.concatenate([f64(last.astype(dtype))[None], f64(h[:-1])])
    # h + (p − h) · m: three roundings of |h| + (|p| + |h|) · |m|
    s = np.abs(f64(h)) + (np.abs(prev) + np.abs(f64(h))) * np.abs(f64(mix))[:, None, :]
    assert_within(got, want, 3 * unit(dtype) * s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["decay", "sigmoid", "sigmoid_nobias", "v_residual"])
def test_gates_equal_numba(which, dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, d = 29, 48
    x = (4.0 * rng.standard_normal((t, d))).astype(dtype)  # from saturated to linear
    b = rng.standard_normal(d).astype(dtype)
    u = unit(dtype)
    if which == "v_residual":
        v, vf = (rng.standard_normal((t, d)).astype(dtype) for _ in range(2))
        got = rwkv7_xp.v_residual(np, v, vf, x.copy(), b)
        want = rwkv7_passes.v_residual(v, vf, x.copy(), b)
        sig = 1.0 / (1.0 + np.exp(-f64(x + b)))
        # v + (v_first − v) · σ: σ within 4 u (below), the difference, product, sum: 7 u
        per_side = 7 * u * (np.abs(f64(v)) + np.abs(f64(vf) - f64(v)) * sig)
        assert_within(got, want, per_side)
        return
    bias = None if which == "sigmoid_nobias" else b
    xs, xn = x.copy(), x.copy()
    if which == "decay":
        got, want = rwkv7_xp.decay_(np, xs, b), rwkv7_passes.decay_(xn, b)
    else:
        got, want = rwkv7_xp.sigmoid_(np, xs, bias), rwkv7_passes.sigmoid_(xn, bias)
    assert got is xs and want is xn  # both write their first argument
    # scale / (1 + e^−(x + b)): x + b rounded alike on both sides; then e^− (~2 u for the
    # float32 polynomial), the sum and the quotient: 4 u relative (products only, no
    # cancellation: relative to the element)
    assert_within(got, want, 4 * u * np.abs(f64(want)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", [True, False])
def test_keys_equal_numba(fused, dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, heads, hd = 21, 3, 16
    k, alpha = columns(rng, t, [heads * hd, heads * hd], dtype)
    alpha = 1.0 / (1.0 + np.exp(-alpha))  # a sigmoid: in (0, 1), a view still
    k_k, k_a = (rng.uniform(0.2, 1.5, heads * hd).astype(dtype) for _ in range(2))
    got = rwkv7_xp.keys(np, k, alpha, k_k, k_a, hd, fused)
    want = rwkv7_passes.keys(np.ascontiguousarray(k), np.ascontiguousarray(alpha), k_k, k_a,
                             hd, fused)  # fmt: skip
    u = unit(dtype)
    a_g, k_g, b_g = got
    a_w, k_w, b_w = want
    # k̂ = (k ⊙ k_k) · inv: the product, inv (a float64 root of a sum of hd squares, rounded
    # once), the product: 3 u + hd · U64 relative; b = k̂ ⊙ α one more
    assert_within(a_g, a_w, (3 * u + hd * U64) * np.abs(f64(a_w)))
    assert_within(b_g, b_w, (4 * u + hd * U64) * np.abs(f64(b_w)))
    # k + k (α − 1) k_a: the difference, two products, the sum: 4 u of |k| + |k (α − 1) k_a|
    ka = np.abs(f64(k)) * np.abs(f64(alpha) - 1.0) * np.abs(f64(k_a))
    assert_within(k_g, k_w, 4 * u * (np.abs(f64(k)) + ka))


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_norm_out_equals_numba(dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, heads, dk, dv, eps = 19, 3, 8, 12, 8 * 1e-5
    o = (3.0 * rng.standard_normal((t, heads, dv)) + 0.7).astype(dtype)
    r, k = (rng.standard_normal((t, heads, dk)).astype(dtype) for _ in range(2))
    v, g = (rng.standard_normal((t, heads, dv)).astype(dtype) for _ in range(2))
    r_k = rng.standard_normal((heads, dk)).astype(dtype)
    w, b = (rng.standard_normal(heads * dv).astype(dtype) for _ in range(2))
    og, on = o.copy(), o.copy()
    got = rwkv7_xp.group_norm_out_(np, og, r, k, v, r_k, g, w, b, eps)
    want = rwkv7_passes.group_norm_out_(on, r, k, v, r_k, g, w, b, eps)
    assert got is og and want is on
    u = unit(dtype)
    o64 = f64(o)
    mean = o64.mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(o64.var(-1, keepdims=True) + eps)
    w2, b2 = f64(w).reshape(heads, dv), f64(b).reshape(heads, dv)
    terms = np.abs(f64(r) * f64(k) * f64(r_k)).sum(-1, keepdims=True)
    # ((o − m) · inv · w + b + bonus · v) · g: m and inv rounded once each, the difference
    # and two products (5 u of (|o| + |m|) · inv · |w|), the float64 sums of dv terms (dv U64
    # of mean|o| in m, of the variance: dv/2 + 1 U64 of inv); the bonus a sum of dk products
    # of three (dk + 2 u of Σ|r k r_k|), times v; two sums and the gate (3 u of everything)
    norm = np.abs(w2) * inv
    s = (u * (5 * (np.abs(o64) + np.abs(mean)) * norm + 3 * np.abs(b2)
              + (dk + 5) * terms * np.abs(f64(v)))
         + U64 * norm * (dv * np.abs(o64).mean(-1, keepdims=True)
                         + (dv / 2 + 1) * np.abs(o64 - mean)))  # fmt: skip
    assert_within(got, want, np.abs(f64(g)) * s)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sqrelu_gives_numbas_bits(dtype):
    print(f"seed={SEED}")
    x = np.random.default_rng(SEED).standard_normal((17, 30)).astype(dtype)
    xs, xn = x.copy(), x.copy()
    got = rwkv7_xp.sqrelu_(np, xs)
    assert got is xs
    # max(x, 0) is exact and its square one rounding on both sides: the same bits
    np.testing.assert_array_equal(got, rwkv7_passes.sqrelu_(xn))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("biased", [True, False])
def test_layer_norms_equal_numba(biased, dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, d, eps = 23, 64, 1e-5
    x, y = columns(rng, t, [d, d], dtype, scale=3.0)
    x = x + dtype(0.5)  # a mean away from 0 (and a C-contiguous copy)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    b = rng.standard_normal(d).astype(dtype) if biased else None
    u = unit(dtype)

    def per_side(h):
        h64 = f64(h)
        m = h64.mean(-1, keepdims=True)
        inv = 1.0 / np.sqrt(h64.var(-1, keepdims=True) + eps)
        # (h − m) · inv · w + b: m and inv rounded once each, the difference, two products
        # and the sum: 5 u of (|h| + |m|) · inv · |w|, 1 u of |b|; the float64 sums of d
        # terms: d U64 of mean|h| in m, (d/2 + 1) U64 relative in inv
        norm = inv * np.abs(f64(w))
        s = u * (5 * (np.abs(h64) + np.abs(m)) * norm + (0 if b is None else np.abs(f64(b))))
        acc = d * np.abs(h64).mean(-1, keepdims=True) + (d / 2 + 1) * np.abs(h64 - m)
        return s + U64 * norm * acc

    got = rwkv7_xp.layer_norm(np, x, w, b, eps)
    assert_within(got, rwkv7_passes.layer_norm(x, w, b, eps), per_side(x))
    s_g, n_g = rwkv7_xp.add_layer_norm(np, x, y, w, b, eps)
    s_w, n_w = rwkv7_passes.add_layer_norm(x, np.ascontiguousarray(y), w, b, eps)
    np.testing.assert_array_equal(s_g, s_w)  # one rounding each: the same bits
    assert_within(n_g, n_w, per_side(s_w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 2, 40])
@pytest.mark.parametrize("biased", [True, False])
def test_conv_silu_equals_numba(biased, t, dtype):
    """After a carried tail of W−1 = 3 raw inputs (float64, as a float64 state holds it)."""
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED + t)
    d, width = 24, 4
    [x] = columns(rng, t, [d], dtype)
    tail = rng.standard_normal((width - 1, d))
    w = rng.standard_normal((d, width)).astype(dtype)
    bias = rng.standard_normal(d).astype(dtype) if biased else None
    got, got_tail = mamba2_xp.conv_silu(np, x, tail, w, bias)
    want, want_tail = mamba2_passes.conv_silu(x, tail, w, bias)
    np.testing.assert_array_equal(got_tail, want_tail)  # copies: the same bits
    assert got_tail.dtype == tail.dtype
    full = np.concatenate([f64(tail.astype(dtype)), f64(x)])
    terms = sum(np.abs(full[j : j + t]) * np.abs(f64(w[:, j])) for j in range(width))
    terms = terms + (0 if bias is None else np.abs(f64(bias)))
    # the pre-activation: bias and W products summed in order, W + 1 roundings of Σ|terms|
    # (fewer where contracted to FMAs); SiLU's slope is within 1.1, and SiLU itself is 4 u
    # relative (e^−, the sum, the quotient)
    assert_within(got, want, unit(dtype) * (1.1 * (width + 1) * terms + 4 * np.abs(f64(want))))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("mode", mamba2_passes.GATED_NORM_MODES)
def test_gated_norm_equals_numba(mode, groups, dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, d = 31, 96
    z, y = columns(rng, t, [d, d], dtype)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    weight = None if mode == "gate" else w
    got = mamba2_xp.gated_norm(np, y, z, weight, groups, 1e-5, mode)
    want = mamba2_passes.gated_norm(y, z, weight, groups, 1e-5, mode)
    # products and quotients only (the sum of squares is of positive float64 terms, d/groups
    # of them: that many U64 relative, half of it through the root): SiLU's 4 u, the gate's
    # product, the root's rounding, two products: 8 u of the element
    rel = 8 * unit(dtype) + (d // groups) * U64
    assert_within(got, want, rel * np.abs(f64(want)))


def test_gated_norm_refuses_an_unknown_mode():
    y = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="expected a mode of"):
        mamba2_xp.gated_norm(np, y, y, None, 1, 1e-5, "norm")


def _names(module, root: str) -> set[str]:
    """The attributes of `root` (a name) the module's code reads: xp.exp -> "exp"."""
    tree = ast.parse(inspect.getsource(module))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == root
    }


@pytest.mark.parametrize("module", [rwkv7_xp, mamba2_xp])
def test_the_passes_call_only_what_cupy_has(module):
    """CuPy imports without a device: every namespace function the passes call is one of its
    own; of NumPy they use only what never touches an array (a device array passed to a NumPy
    function would be refused or copied to the host)."""
    cupy = pytest.importorskip("cupy")
    used = _names(module, "xp")
    assert used, "no namespace call found: the check reads nothing"
    missing = sorted(n for n in used if not hasattr(cupy, n))
    assert not missing, f"{module.__name__} calls xp.{missing}, which CuPy lacks"
    assert _names(module, "np") <= {"dtype", "errstate"}, _names(module, "np")
