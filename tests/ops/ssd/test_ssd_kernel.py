"""Mamba-2's SSD kernel (`linstream.ops.ssd`) against transformers' own: `mamba2_chunk_scan`, the
SSD of Mamba2Mixer's pure-PyTorch path (tests/helpers/mamba2_oracle.py), over random splits of a
sequence into calls, random chunk lengths, groups, head and state sizes, time-step limits and
skips (Hypothesis draws a seed; the seed and the case print and rebuild it).

Tolerance, derived from the dtype (tests/helpers/ssd_cases.py): within FACTOR · e32 · u / u32 of
transformers' float64 scan, e32 its own float32 run's error on the case (for the random draws: or
within the a-priori bound of summation, when larger: one sampled rounding error against another
can pass any fixed factor on a short case — the seed 7676 did).  Nothing is added for the
kernel's segment sums: it sums each segment directly (`linstream.ops.ssd.numba`), as
transformers' scan does, so their rounding is relative to the segment and within the same bound;
differences of a chunk's prefix sums were not (their error grows with the decay before the
segment; the test of strong then weak decays below shows it).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is a test extra (make test installs it)")

from helpers.mamba2_oracle import chunk_scan  # noqa: E402
from helpers.ssd_cases import (  # noqa: E402
    FACTOR,
    U32,
    case,
    reference,
    streamed,
    tolerances,
    unit,
    worst,
)
from linstream.ops.decay.constants import FLUSH_LOG_F32  # noqa: E402
from linstream.ops.ssd.naive import ssd_recurrent  # noqa: E402
from linstream.ops.ssd.numba import ssd_chunks  # noqa: E402


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize(
    "dtypes",
    [(np.float64, np.float64), (np.float32, np.float64), (np.float32, np.float32)],
    ids=["f64", "f32-state64", "f32-state32"],
)
def test_random_splits_equal_transformers_scan(dtypes, seed):
    cdt, sdt = dtypes
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 160))
    g, hpg = int(rng.choice([1, 2, 4])), int(rng.integers(1, 4))
    p, n = int(rng.choice([4, 8, 16])), int(rng.choice([4, 16, 64]))
    chunk = int(rng.choice([1, 3, 16, 64, 256]))
    limit = (0.0, float("inf")) if rng.random() < 0.5 else (0.05, float(rng.uniform(0.1, 2.0)))
    cuts = rng.integers(1, t, size=int(rng.integers(0, 5))).tolist() if t > 1 else []
    bounds = sorted({0, t, *cuts})
    print(f"seed={seed} T={t} G={g} H={g * hpg} P={p} N={n} C={chunk} limit={limit} {bounds}")
    kw = case(rng, t, g, hpg, p, n)
    ref = tolerances(kw, limit, cdt, sdt)  # the sampled bound, or the a-priori one if larger
    y64, s64, tol, tol_s = ref["y64"], ref["s64"], ref["tol"], ref["tol_s"]
    y, s = streamed(kw, limit, bounds, cdt, sdt, chunk)
    assert y.dtype == cdt and s.dtype == sdt
    err, err_s = worst(y, y64), worst(s, s64)
    print(f"error {err:.3g} (tolerance {tol:.3g}), state {err_s:.3g} ({tol_s:.3g})")
    assert err <= tol
    assert err_s <= tol_s


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_naive_reference_equals_transformers_scan(seed):
    """The float64 token-by-token reference is transformers' rule, from a given state too:
    within the sampled bound (FACTOR · e32 · u64 / u32) or the a-priori bound of summation
    (FACTOR · (T + 3) · u64 · the largest Σ|terms|, the scan over |x|, |B|, |C|, |D| and |s0|),
    whichever is larger, as `ssd_cases.tolerances` allows the kernels (the sampled bound alone
    failed on the seed 13102748: 3.1e-15 against 2.5e-15, its float32 error a lucky sample)."""
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 80))
    kw = case(rng, t, 2, 2, 8, 16)
    h, p, n = 4, 8, 16
    s0 = rng.standard_normal((h, p, n))
    print(f"seed={seed} T={t}")
    args = (kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"])
    y64, s64 = chunk_scan(*args, d=kw["d"], dt_bias=kw["dt_bias"], state=s0, dtype=torch.float64)
    y32, s32 = chunk_scan(*args, d=kw["d"], dt_bias=kw["dt_bias"], state=s0, dtype=torch.float32)
    ya, sa = chunk_scan(
        np.abs(kw["x"]), kw["dt"], kw["a"], np.abs(kw["b"]), np.abs(kw["c"]),
        d=np.abs(kw["d"]), dt_bias=kw["dt_bias"], state=np.abs(s0), dtype=torch.float64,
    )  # fmt: skip
    y, s = ssd_recurrent(*args, kw["d"], s0, dt_bias=kw["dt_bias"])
    scale = unit(np.float64) / U32
    summed = FACTOR * (t + 3) * unit(np.float64)
    assert worst(y, y64) <= max(FACTOR * worst(y32, y64) * scale, summed * float(np.max(ya)))
    assert worst(s, s64) <= max(FACTOR * worst(s32, s64) * scale, summed * float(np.max(sa)))


def test_one_token_calls_equal_one_call():
    rng = np.random.default_rng(3)
    kw = case(rng, 40, 2, 3, 8, 16)
    inf = (0.0, float("inf"))
    whole, s_whole = streamed(kw, inf, [0, 40], np.float64, np.float64, 64)
    steps, s_steps = streamed(kw, inf, list(range(41)), np.float64, np.float64, 64)
    np.testing.assert_allclose(steps, whole, rtol=0, atol=1e-12 * np.abs(whole).max())
    np.testing.assert_allclose(s_steps, s_whole, rtol=0, atol=1e-12 * np.abs(s_whole).max())


def test_no_tokens_leave_the_state_as_it_was():
    rng = np.random.default_rng(4)
    kw = case(rng, 0, 1, 2, 4, 4)
    state = rng.standard_normal((2, 4, 4))
    before = state.copy()
    y = ssd_chunks(kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"], kw["d"], state)
    assert y.shape == (0, 2, 4)
    np.testing.assert_array_equal(state, before)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", ["x", "b", "c", "dt"])
def test_a_non_finite_input_never_reaches_earlier_tokens(bad, where):
    """Token 37 holds an Inf or NaN: the outputs of tokens 0..36 are those of the clean prefix,
    for every chunk length and split (the kernel starts a chunk at such a token)."""
    rng = np.random.default_rng(5)
    kw = case(rng, 60, 2, 2, 8, 16)
    inf = (0.0, float("inf"))
    clean, _ = streamed(kw, inf, [0, 37], np.float32, np.float64, 64)
    if where == "dt":
        kw["dt"][37, 1] = bad
    else:
        kw[where][37, 1, 2] = bad
    for chunk, bounds in itertools.product([1, 16, 64], [[0, 60], [0, 30, 60], [0, 36, 37, 60]]):
        y, _ = streamed(kw, inf, bounds, np.float32, np.float64, chunk)
        assert np.all(np.isfinite(y[:37])), (chunk, bounds)
        np.testing.assert_allclose(y[:37], clean, rtol=1e-5, atol=1e-5)


def test_decays_that_erase_the_state_give_no_nan():
    """Time steps so large that e^{s·A} underflows to 0 (s·A ≈ −1e4 and below, floored): the
    state is erased, never NaN, and what follows does not depend on what came before."""
    rng = np.random.default_rng(6)
    kw = case(rng, 50, 1, 2, 4, 8)
    kw["dt"][10] = 1e4
    inf = (0.0, float("inf"))
    y, s = streamed(kw, inf, [0, 13, 50], np.float64, np.float64, 16)
    ref, ref_s = ssd_recurrent(
        kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"], kw["d"], dt_bias=kw["dt_bias"]
    )
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(s))
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_allclose(s, ref_s, rtol=0, atol=1e-12 * np.abs(ref_s).max())
    kw["x"][:10] = rng.standard_normal(kw["x"][:10].shape)  # another past: the same future
    later, _ = streamed(kw, inf, [0, 50], np.float64, np.float64, 64)
    np.testing.assert_allclose(later[10:], y[10:], rtol=0, atol=1e-12 * np.abs(y).max())


def test_decays_near_one_keep_long_sums():
    """A ≈ 0 (decay e^{-1e-9} per token): the state sums every token; float32 compute with a
    float64 state stays within float32 rounding of the float64 reference."""
    rng = np.random.default_rng(7)
    kw = case(rng, 400, 1, 2, 8, 16)
    kw["a"][:] = -1e-9
    inf = (0.0, float("inf"))
    ref, ref_s = ssd_recurrent(
        kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"], kw["d"], dt_bias=kw["dt_bias"]
    )
    y64, s64 = reference(kw, inf, torch.float64)
    y32, s32 = reference(kw, inf, torch.float32)
    y, s = streamed(kw, inf, [0, 100, 333, 400], np.float32, np.float64, 64)
    assert worst(y, ref) <= FACTOR * worst(y32, y64)
    assert worst(s, ref_s) <= FACTOR * worst(s32, s64)


@pytest.mark.parametrize("chunk", [200, 256])
def test_strong_then_weak_decays_keep_float64_precision(chunk):
    """Decays of ~e^-19 a token for the first 128 tokens, then of ~e^-2e-5: in a chunk of 200 or
    256 the later tokens sum long segments of the weak decays (e^{G_i − G_j} near 1) after a
    prefix sum near −2,400.  Summed directly, each segment rounds relative to itself, so float64
    stays within the derived bound (8 · e32 · u64 / u32, as above); the old kernel's differences
    of prefix sums, off by ~|G_i|·u64 in the exponent, missed it by ~5,000× (4e-9 at C = 256)."""
    seed = 20261204
    rng = np.random.default_rng(seed)
    t, half = 256, 128
    print(f"seed={seed} T={t} C={chunk}")
    kw = case(rng, t, 1, 2, 8, 16)
    kw["a"][:] = -1.0
    kw["dt"][:half] = 20.0  # softplus(20 − 2 ± 1) ≈ 18–20: decays ≈ e^-19 a token
    kw["dt"][half:] = -9.0  # softplus(−11 ± 1) ≈ 1.7e-5: decays ≈ e^-1.7e-5
    kw["dt_bias"][:] = -2.0
    inf = (0.0, float("inf"))
    y64, s64 = reference(kw, inf, torch.float64)
    y32, s32 = reference(kw, inf, torch.float32)
    y, s = streamed(kw, inf, [0, t], np.float64, np.float64, chunk)
    tol = FACTOR * worst(y32, y64) * unit(np.float64) / U32
    tol_s = FACTOR * worst(s32, s64) * unit(np.float64) / U32
    print(f"error {worst(y, y64):.3g} (tol {tol:.3g}), state {worst(s, s64):.3g} ({tol_s:.3g})")
    assert worst(y, y64) <= tol
    assert worst(s, s64) <= tol_s


@pytest.mark.parametrize(("cdt", "sdt"), [(np.float32, np.float32), (np.float32, np.float64)])
def test_terms_decayed_past_the_flush_are_zeros_not_subnormals(cdt, sdt):
    """One input at token 0, then log decays of −softplus(2) a step: once its weight
    e^{G_i − G_0} is below the flush (e^-60 in float32, `flush_log`) the outputs and the state
    are exact zeros, not the subnormal numbers the decayed products made (Intel's cores run
    each instruction on one through a microcode assist: Mamba-2's scan ran 10x slower); the
    outputs before stay within float32's rounding of the float64 scan: (N + 4 + |G_i|)
    roundings (the C·B sum over N, the exponential's ~2 ulp, the step and x, and the exponent
    G_i rounded to float32), times 2."""
    t, h, p, n = 64, 2, 4, 8
    rng = np.random.default_rng(11)
    x = np.zeros((t, h, p), cdt)
    x[0] = rng.uniform(0.5, 1.0, (h, p))
    b = rng.uniform(0.5, 1.0, (t, 1, n)).astype(cdt)
    c = rng.uniform(0.5, 1.0, (t, 1, n)).astype(cdt)
    dt = np.full((t, h), 2.0)
    a = np.full(h, -1.0)
    state = np.zeros((h, p, n), sdt)
    y = ssd_chunks(x, dt, a, b, c, None, state, chunk_size=t)
    first = math.ceil(-FLUSH_LOG_F32 / math.log1p(math.exp(2.0)))  # the first token past it
    tiny = np.finfo(np.float32).tiny
    assert not ((y != 0) & (np.abs(y) < tiny)).any()
    assert np.all(y[first + 1 :] == 0) and np.all(state == 0)
    want = ssd_recurrent(x, dt, a, b, c, None, np.zeros((h, p, n)), dt_bias=None)[0]
    assert np.all(want[first - 1] != 0)  # the float64 scan's values there are not zeros
    # the exponent |G_i| is rounded to float32 too: e^{G_i} is off by |G_i|·u32 besides
    g = math.log1p(math.exp(2.0)) * np.arange(first - 1)
    bound = 2 * (n + 4 + g) * U32
    rel = np.abs(y[: first - 1] / want[: first - 1] - 1).max(axis=(1, 2))
    assert (rel <= bound).all(), (rel / bound).max()
