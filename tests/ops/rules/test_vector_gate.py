"""The vector-gated rule (a log gate per key dimension: GLA, HGRN2): its chunkwise Numba kernel
equals its float64 token-by-token reference for any split into calls and any chunk length
(Hypothesis draws a seed; the seed, the split points and the chunk length are printed and
rebuild the case), and the reference itself matches a case worked by hand.

Tolerance (derived): an output y_i is a sum of at most n = d_k·(C + 1) + T/C products (d_k
terms of q against the carried state, d_k·C in the in-chunk scores, and the T/C chunk
contributions the state carries), each rounding by u (the compute dtype's unit roundoff) relative
to the largest term M, so |Δy| ≤ 4·n·(u_c + u_s)·M.  Every gate is ≤ 1, so a term is bounded by
M = max(|q|·|S|, |q|·|k|·|v|) with |S| the largest reference state entry (and for the state
itself by max(|S|, |k|·|v|)).  The state's dtype adds the same bound with its own u.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.decay.vector_naive import vector_gated_recurrent
from linstream.ops.decay.vector_numba import vector_gated_chunks


def heads(x, dtype):
    return np.ascontiguousarray(np.asarray(x).transpose(1, 0, 2), dtype=dtype)


def run(q, k, v, g, s0, bounds, c, cdt, sdt):
    """The kernel over the calls [a, b) of `bounds`, from state s0; out [T, H, d_v]."""
    s = np.array(s0, dtype=sdt)
    outs = []
    for a, b in itertools.pairwise(bounds):
        o = vector_gated_chunks(
            heads(q[a:b], cdt), heads(k[a:b], cdt), heads(v[a:b], cdt), heads(g[a:b], cdt), s,
            chunk_size=c,
        )  # fmt: skip
        assert o.dtype == cdt and s.dtype == sdt
        outs.append(o.transpose(1, 0, 2))
    return np.concatenate(outs), s


def tolerance(q, k, v, s_ref, t, c, cdt, sdt):
    dk = q.shape[2]
    qm, km, vm, sm = (float(np.max(np.abs(x))) for x in (q, k, v, s_ref))
    m = max(qm * sm, qm * km * vm, sm, km * vm)
    n = dk * (c + 1) + -(-t // c)
    u = float(np.finfo(cdt).eps) / 2 + float(np.finfo(sdt).eps) / 2
    return 4 * n * u * m


def test_worked_example():
    """Keys [1,0], [0,1]; values [2], [3]; gates of token 2: [1/2, 1]; query [1,1] at both.
    S1 = [[2],[0]], y1 = 2; S2 = diag(1/2, 1) S1 + [[0],[3]] = [[1],[3]], y2 = 4."""
    k = np.array([[1.0, 0.0], [0.0, 1.0]])[:, None, :]
    v = np.array([[2.0], [3.0]])[:, None, :]
    q = np.ones((2, 1, 2))
    g = np.log(np.array([[1.0, 1.0], [0.5, 1.0]]))[:, None, :]
    ref, s = vector_gated_recurrent(q, k, v, log_gate=g)
    np.testing.assert_allclose(ref[:, 0, 0], [2.0, 4.0], rtol=0, atol=8 * 2.0**-53 * 4)
    np.testing.assert_allclose(s[0], [[1.0], [3.0]], rtol=0, atol=8 * 2.0**-53 * 3)
    out, s2 = run(q, k, v, g, np.zeros((1, 2, 1)), [0, 2], 2, np.float64, np.float64)
    np.testing.assert_allclose(out, ref, rtol=0, atol=8 * 2.0**-53 * 4)
    np.testing.assert_allclose(s2, s, rtol=0, atol=8 * 2.0**-53 * 3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtypes", [("f64", "f64"), ("f32", "f64"), ("f32", "f32")],
                         ids=["f64-state64", "f32-state64", "f32-state32"])  # fmt: skip
def test_random_splits_match_the_reference(dtypes, seed):
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 160))
    h = int(rng.integers(1, 4))
    dk = int(rng.integers(1, 9))
    dv = int(rng.integers(1, 7))
    c = int(rng.choice([1, 2, 5, 16, 32, 64]))
    n_splits = int(rng.integers(0, 5))
    bounds = sorted({0, t, *rng.integers(0, t + 1, size=n_splits).tolist()})
    print(f"seed={seed} T={t} H={h} dk={dk} dv={dv} C={c} bounds={bounds}")
    cdt = np.float64 if dtypes[0] == "f64" else np.float32
    sdt = np.float64 if dtypes[1] == "f64" else np.float32
    q, k, v = (rng.standard_normal((t, h, d)).astype(cdt) for d in (dk, dk, dv))
    # gates from ~1 down to e^-3 (a few dimensions nearly forget each token), as GLA's
    # logsigmoid(x)/16 and HGRN2's forget gates do
    g = (-rng.exponential(0.3, size=(t, h, dk))).astype(cdt)
    s0 = rng.standard_normal((h, dk, dv))
    ref, ref_s = vector_gated_recurrent(q, k, v, s0, log_gate=g)
    out, s = run(q, k, v, g, s0, bounds, c, cdt, sdt)
    tol = tolerance(q, k, v, np.maximum(np.abs(ref_s).max(), np.abs(s0).max()), t, c, cdt, sdt)
    assert float(np.max(np.abs(out - ref))) <= tol
    assert float(np.max(np.abs(s - ref_s))) <= tol


def test_inputs_are_not_mutated_and_the_state_is_updated_in_place():
    rng = np.random.default_rng(3)
    print("seed=3")
    q, k, v = (rng.standard_normal((2, 20, 4)) for _ in range(3))
    g = -rng.exponential(0.2, size=(2, 20, 4))
    s = rng.standard_normal((2, 4, 4))
    copies = [x.copy() for x in (q, k, v, g)]
    s_before = s.copy()
    vector_gated_chunks(q, k, v, g, s, chunk_size=8)
    for before, after in zip(copies, (q, k, v, g), strict=True):
        np.testing.assert_array_equal(before, after)
    assert not np.array_equal(s, s_before)


def test_a_gate_of_one_is_the_additive_sum():
    """log gates of 0: S_T = Σ k vᵀ exactly as a plain sum of outer products."""
    rng = np.random.default_rng(4)
    print("seed=4")
    q, k, v = (rng.standard_normal((1, 50, 3)) for _ in range(3))
    s = np.zeros((1, 3, 3))
    out = vector_gated_chunks(q, k, v, np.zeros((1, 50, 3)), s, chunk_size=16)
    want_s = np.einsum("tk,tv->kv", k[0], v[0])
    want_y = np.einsum("tk,tkv->tv", q[0], np.cumsum(k[0][:, :, None] * v[0][:, None, :], 0))
    tol = 4 * (3 * 17 + 4) * 2.0**-53 * 50 * 27
    assert float(np.max(np.abs(s[0] - want_s))) <= tol
    assert float(np.max(np.abs(out[0] - want_y))) <= tol


@pytest.mark.parametrize("sdt", [np.float32, np.float64])
def test_decay_factors_past_the_flush_are_zeros(sdt):
    """One value at token 0 (every key dimension gated by −3 a token): past the flush (e^-60 in
    float32, `flush_log`) its decay factors are zeros, so the state after a 48-token chunk
    (weight e^-141) is exactly zero, not the subnormal numbers the decayed products made
    (Intel's cores run each instruction on one through a microcode assist: ~24x slower); the
    outputs before match the float64 recurrence within float32's rounding: (d_k + 4 + |G_i|)
    roundings, times 2.  (An output's pairs across sub-blocks are one product of two factors,
    each flushed on its own: their product can still be subnormal, so outputs are not
    asserted to be zeros.)"""
    from linstream.ops.decay.constants import FLUSH_LOG_F32

    h, t, dk, dv = 2, 48, 8, 4
    rng = np.random.default_rng(12)
    q = rng.uniform(0.5, 1.0, (h, t, dk)).astype(np.float32)
    k = rng.uniform(0.5, 1.0, (h, t, dk)).astype(np.float32)
    v = np.zeros((h, t, dv), np.float32)
    v[:, 0] = rng.uniform(0.5, 1.0, (h, dv))
    g = np.full((h, t, dk), -3.0, np.float32)
    state = np.zeros((h, dk, dv), sdt)
    y = vector_gated_chunks(q, k, v, g, state, chunk_size=t)
    first = math.ceil(-FLUSH_LOG_F32 / 3.0)  # the first token whose weight is past the flush
    assert np.all(state == 0)
    # the float64 recurrence: y_i = Σ_p q_ip k_0p e^{-3 i} v_0
    q64, k0, v0 = q.astype(np.float64), k[:, 0].astype(np.float64), v[:, 0].astype(np.float64)
    want = np.einsum("hip,hp,hr->hir", q64, k0, v0) * np.exp(-3.0 * np.arange(t))[None, :, None]
    assert np.all(want[:, first - 1] != 0)
    bound = 2 * (dk + 4 + 3.0 * np.arange(first - 1)) * np.finfo(np.float32).eps / 2
    rel = np.abs(y[:, : first - 1] / want[:, : first - 1] - 1).max(axis=(0, 2))
    assert (rel <= bound).all(), (rel / bound).max()
