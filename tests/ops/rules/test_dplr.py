"""The generalized delta rule in DPLR form (RWKV-7's time mix): the float64 reference equals
fla's own (`fla.ops.generalized_delta_rule.dplr.naive.dplr_recurrence`, run as its float64
clone), and the chunkwise Numba kernel equals the reference for any split into calls and any
chunk length (Hypothesis draws a seed; the seed, the split points and the chunk length are
printed and rebuild the case), over long sequences, and at the edges of its inputs.

Tolerance (derived): an output o_i or a pseudo-value u_i is a sum of at most
n = 2·d_k·(C + 1) + C + T/C products (d_k against the carried state, 2·d_k per in-chunk pair in
the four A matrices, C in the forward substitution, and the T/C chunk contributions the state
carries), each rounding by u (the compute dtype's unit roundoff) relative to the largest term M,
so |Δ| ≤ 4·n·(u_c + u_s)·M with M = max(|q|, 1)·max(|S|, |k|·|v|, |b|·|a|·|S|, |o|) from the
reference run (every decay is ≤ 1, and the rank-1 transitions used here do not expand:
‖diag(w) + b aᵀ‖ ≤ 1, so nothing grows along the chunk).  The state's dtype adds its own u.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.dplr_cases import DTYPES, inputs, run, tolerance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.dplr.naive import dplr_recurrent
from linstream.ops.dplr.numba import SPAN, dplr_chunks


@pytest.mark.parametrize("form", ["rwkv", "general"])
def test_the_reference_equals_fla_dplr_recurrence(form):
    """fla's dplr_recurrence (its float64 clone: the same code with float32 read as float64)
    on the same inputs, its q pre-scaled by d_k^0.5 (it scales q by d_k^-0.5 itself).  Both are
    float64 token by token: T steps of d_k-term sums, |Δ| ≤ 4·T·(2·d_k + 3)·u64·M."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("fla", reason="flash-linear-attention is a test extra")
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence
    from helpers.fla_oracle import _f64_clone

    seed = 20261204
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    t, h, dk, dv = 70, 2, 16, 8
    x = inputs(rng, t, h, dk, dv, form)
    s0 = rng.standard_normal((h, dk, dv))
    ref, s_ref = dplr_recurrent(*x, state=s0)
    q, k, v, a, b, w = (torch.from_numpy(y).transpose(0, 1)[None] for y in x)  # [1, H, T, ·]
    o, s = _f64_clone(dplr_recurrence)(
        q * dk**0.5, k, v, a, b, w, initial_state=torch.from_numpy(s0)[None]
    )
    m = max(float(np.max(np.abs(ref))), float(np.max(np.abs(s_ref))))
    tol = 4 * t * (2 * dk + 3) * (np.finfo(np.float64).eps / 2) * m
    err = max(
        float(np.max(np.abs(o[0].transpose(0, 1).numpy() - ref))),
        float(np.max(np.abs(s[0].numpy() - s_ref))),
    )
    print(f"{form}: |Δ| {err:.3g}, tolerance {tol:.3g}")
    assert o.dtype == torch.float64 and err <= tol


def fla_dplr(x, s0):
    """fla's `dplr_recurrence` and `dplr_chunkwise` (their float64 clones, fla's code with
    float32 read as float64) on [T, H, ·] float64 inputs from state s0: (out, S) of each."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("fla", reason="flash-linear-attention is a test extra")
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_chunkwise, dplr_recurrence
    from helpers.fla_oracle import _f64_clone

    dk = x[0].shape[2]
    q, k, v, a, b, w = (torch.from_numpy(np.ascontiguousarray(y)).transpose(0, 1)[None] for y in x)
    init = torch.from_numpy(np.asarray(s0, np.float64))[None]
    runs = []
    default = torch.get_default_dtype()
    for fn in (dplr_recurrence, dplr_chunkwise):
        torch.set_default_dtype(torch.float64)  # dplr_chunkwise's torch.zeros take the default
        try:
            o, s = _f64_clone(fn)(q * dk**0.5, k, v, a, b, w, initial_state=init.clone())
        finally:
            torch.set_default_dtype(default)
        assert o.dtype == torch.float64 and s.dtype == torch.float64
        runs.append((o[0].transpose(0, 1).numpy(), s[0].numpy()))
    return runs


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtypes", list(DTYPES))
def test_random_splits_match_fla_naive_functions(dtypes, seed):
    """The kernel, over random splits into calls and a random chunk length, against fla's own
    naive DPLR functions (the token-by-token recurrence and its chunkwise form) in float64 on
    the same (compute-dtype-rounded) RWKV-7-form inputs.  Tolerance: the kernel's derived bound
    (`tolerance`) plus fla's own float64 rounding, 4·T·(2·d_k + 3)·u64·M (T token steps of
    d_k-term sums); fla's chunkwise form (its chunks of 32, T a multiple) adds its own
    in-chunk sums, the same bound at C = 32."""
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(seed)
    h, dk, dv = int(rng.integers(1, 3)), int(rng.choice([4, 8, 16])), int(rng.choice([4, 8]))
    t = 32 * int(rng.integers(1, 5))  # fla's chunkwise form needs whole chunks of 32
    c = int(rng.choice([1, 3, 16, 32, 64]))
    bounds = sorted({0, t, *rng.integers(0, t + 1, size=int(rng.integers(0, 5))).tolist()})
    print(f"seed={seed} {dtypes} T={t} H={h} dk={dk} dv={dv} C={c} bounds={bounds}")
    x = tuple(np.asarray(y, cdt).astype(np.float64) for y in inputs(rng, t, h, dk, dv, "rwkv"))
    s0 = np.asarray(rng.standard_normal((h, dk, dv)), sdt)
    out, s = run(x, s0, bounds, c, cdt, sdt)
    for name, (ref, s_ref) in zip(("recurrence", "chunkwise"), fla_dplr(x, s0), strict=True):
        m = max(float(np.max(np.abs(ref))), float(np.max(np.abs(s_ref))))
        fla_err = 4 * t * (2 * dk + 3) * (np.finfo(np.float64).eps / 2) * m
        tol = tolerance(x, ref, s_ref, t, max(c, 32), cdt, sdt) + fla_err
        err = max(float(np.max(np.abs(out - ref))), float(np.max(np.abs(s - s_ref))))
        print(f"fla {name}: |Δ| {err:.3g}, tolerance {tol:.3g}")
        assert err <= tol, name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("form", ["rwkv", "general"])
@pytest.mark.parametrize("dtypes", list(DTYPES))
def test_random_splits_match_the_reference(dtypes, form, seed):
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(seed)
    t, h = int(rng.integers(1, 200)), int(rng.integers(1, 4))
    dk, dv = int(rng.integers(1, 10)), int(rng.integers(1, 8))
    c = int(rng.choice([1, 2, 5, 16, 32, 64]))
    bounds = sorted({0, t, *rng.integers(0, t + 1, size=int(rng.integers(0, 5))).tolist()})
    print(f"seed={seed} {dtypes} {form} T={t} H={h} dk={dk} dv={dv} C={c} bounds={bounds}")
    x = inputs(rng, t, h, dk, dv, form)
    x = tuple(np.asarray(y, cdt).astype(np.float64) for y in x)  # the values the kernel gets
    s0 = np.asarray(rng.standard_normal((h, dk, dv)), sdt)
    ref, s_ref = dplr_recurrent(*x, state=s0)
    out, s = run(x, s0, bounds, c, cdt, sdt)
    tol = tolerance(x, ref, s_ref, t, c, cdt, sdt)
    err = max(float(np.max(np.abs(out - ref))), float(np.max(np.abs(s - s_ref))))
    print(f"|Δ| {err:.3g}, tolerance {tol:.3g}")
    assert err <= tol


def test_strided_inputs_and_one_token_calls():
    """[T, H, D] views with any strides (a model's projections, reshaped) give the same bits as
    contiguous copies; one token per call equals one call."""
    rng = np.random.default_rng(5)
    t, h, dk, dv = 40, 3, 8, 8
    wide = rng.standard_normal((t, h, 6 * dk)).astype(np.float32)
    x = [wide[:, :, i * dk : (i + 1) * dk] for i in range(6)]
    x[5] = -np.abs(x[5]) * 0.3
    x[3] = -x[1] / np.linalg.norm(x[1], axis=-1, keepdims=True)
    x[4] = -x[3] * 0.5
    s1, s2 = np.zeros((h, dk, dv)), np.zeros((h, dk, dv))
    o1 = dplr_chunks(*x, s1, chunk_size=16)
    o2 = dplr_chunks(*(np.ascontiguousarray(y) for y in x), s2, chunk_size=16)
    assert np.array_equal(o1, o2) and np.array_equal(s1, s2)
    ref, s_ref = dplr_recurrent(*x)
    one, s3 = run(x, np.zeros((h, dk, dv)), list(range(t + 1)), 16, np.float32, np.float64)
    tol = tolerance([y.astype(np.float64) for y in x], ref, s_ref, t, 1, np.float32, np.float64)
    assert float(np.max(np.abs(one - ref))) <= tol
    assert float(np.max(np.abs(s3 - s_ref))) <= tol


@pytest.mark.parametrize("dtypes", list(DTYPES))
def test_decays_too_strong_for_one_chunk_product_are_cut(dtypes):
    """log w = −5 at every token: 63 of them sum to −315, whose e^{+315} in one chunk's split
    product overflows float32 (and e^{-315} underflows): the kernel ends its chunks where the
    decays since the chunk's first token would pass −SPAN, so the outputs stay the reference's."""
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(11)
    t, h, dk, dv = 130, 2, 8, 4
    x = list(inputs(rng, t, h, dk, dv, "rwkv"))
    x[5] = np.full((t, h, dk), -5.0)
    x[5][:, :, 0] = -0.01  # one slow dimension carries the past far
    assert SPAN[np.dtype(cdt)] < 63 * 5.0
    x = [np.asarray(y, cdt).astype(np.float64) for y in x]
    ref, s_ref = dplr_recurrent(*x)
    out, _ = run(x, np.zeros((h, dk, dv)), [0, t], 64, cdt, sdt)
    assert np.isfinite(out).all()
    assert float(np.max(np.abs(out - ref))) <= tolerance(x, ref, s_ref, t, 64, cdt, sdt)


@pytest.mark.parametrize("dtypes", list(DTYPES))
def test_erasing_decays_and_non_finite_values(dtypes):
    """A decay of −inf and one of −finfo.max at two tokens of one chunk erase the state there,
    as in the reference; an Inf in v reaches the outputs from its own token on, never an
    earlier token's (the masked product would multiply a masked zero by it)."""
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(12)
    t, h, dk, dv = 48, 2, 6, 5
    x = [np.asarray(y, cdt).astype(np.float64) for y in inputs(rng, t, h, dk, dv, "rwkv")]
    x[5][[9, 13], 0, :] = [[-np.inf], [-np.finfo(np.float64).max]]
    ref, s_ref = dplr_recurrent(*x)
    out, s = run(x, np.zeros((h, dk, dv)), [0, t], 32, cdt, sdt)
    tol = tolerance(x, ref, s_ref, t, 32, cdt, sdt)
    assert float(np.max(np.abs(out - ref))) <= tol and float(np.max(np.abs(s - s_ref))) <= tol
    x[2][20, 1, 0] = np.inf
    out, _ = run(x, np.zeros((h, dk, dv)), [0, t], 32, cdt, sdt)
    assert np.isfinite(out[:20]).all() and float(np.max(np.abs(out[:20] - ref[:20]))) <= tol
    assert not np.isfinite(out[20:, 1]).all()
