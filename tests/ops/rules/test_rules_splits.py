"""Every rule's chunkwise kernel equals its float64 token-by-token reference for any split of a
sequence into calls and any chunk length (Hypothesis draws a seed; the seed, the split points and
the chunk length are printed and rebuild the case).

Tolerance (derived): each output is a sum of at most n = F + C + T/C products (a feature dot, the
in-chunk sum, the carried chunk contributions), each step rounding by u (the compute dtype's unit
roundoff) relative to the magnitude M of the terms, so |Δy| ≤ 4·n·u·M.  M is measured by the
reference run on |q|-free magnitudes: max over tokens of max|y_ref| and max|S_ref| plus max|v|
(for positive maps and gates ≤ 1 every term is bounded by these).  The state's dtype adds the
same bound with its own u for the carried sums.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops import AttentionState, causal_linear_attention
from linstream.ops.additive.naive import rule_recurrent

RULES = ["decay", "gated", "gated-unnormalized", "delta", "gated_delta"]
MAPS = ["elu+1", "relu", {"name": "favor+", "num_features": 12, "seed": 2}]


def params(rule: str, t: int, h: int, rng: np.random.Generator) -> dict:
    """Gates over a wide range (α from 0.5 to ~1) and β over (0, 1]."""
    kw: dict = {}
    if rule == "decay":
        kw["gamma"] = rng.uniform(0.5, 0.999, size=h)
    if rule in ("gated", "gated_delta"):
        kw["log_alpha"] = -rng.exponential(0.2, size=(t, h))
    if rule in ("delta", "gated_delta"):
        kw["beta"] = rng.uniform(0.0, 1.0, size=(t, h)) ** 0.5 + 1e-3
        kw["beta"] = np.minimum(kw["beta"], 1.0)
    return kw


def sliced(kw: dict, a: int, b: int) -> dict:
    return {n: (x[a:b] if isinstance(x, np.ndarray) and x.ndim == 2 else x) for n, x in kw.items()}


def tolerance(out_ref, s_ref, v, t, c, f, cdt, sdt) -> float:
    m = max(float(np.max(np.abs(out_ref))), float(np.max(np.abs(s_ref))), float(np.max(np.abs(v))))
    n = f + c + -(-t // c)
    u_c = float(np.finfo(cdt).eps) / 2
    u_s = float(np.finfo(sdt).eps) / 2
    return 4 * n * (u_c + u_s) * m


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("name", RULES)
@pytest.mark.parametrize("dtypes", [("f64", "f64"), ("f32", "f64"), ("f32", "f32")],
                         ids=["f64-state64", "f32-state64", "f32-state32"])  # fmt: skip
def test_random_splits_match_the_reference(name, dtypes, seed):
    rng = np.random.default_rng(seed)
    rule = name.split("-")[0]
    normalize = "unnormalized" not in name
    t = int(rng.integers(1, 160))
    h = int(rng.integers(1, 4))
    dk = int(rng.integers(1, 9))
    dv = int(rng.integers(1, 7))
    fmap = MAPS[int(rng.integers(len(MAPS)))]
    c = int(rng.choice([1, 2, 5, 16, 64]))
    n_splits = int(rng.integers(0, 5))
    bounds = sorted({0, t, *rng.integers(0, t + 1, size=n_splits).tolist()})
    print(f"seed={seed} rule={name} T={t} H={h} dk={dk} dv={dv} map={fmap} C={c} "
          f"bounds={bounds}")  # fmt: skip
    cdt = np.float64 if dtypes[0] == "f64" else np.float32
    sdt = np.float64 if dtypes[1] == "f64" else np.float32
    q, k, v = (rng.standard_normal((t, h, d)) for d in (dk, dk, dv))
    q, k, v = q.astype(cdt), k.astype(cdt), v.astype(cdt)
    kw = params(rule, t, h, rng)
    if rule in ("gated", "decay"):
        kw["normalize"] = normalize
    ref, ref_state = rule_recurrent(q, k, v, rule=rule, feature_map=fmap, **kw)
    state = None
    outs = []
    for a, b in itertools.pairwise(bounds):
        o, state = causal_linear_attention(
            q[a:b], k[a:b], v[a:b], state, rule=rule, feature_map=fmap, chunk_size=c,
            state_dtype=sdt, **sliced(kw, a, b),
        )  # fmt: skip
        assert o.dtype == cdt and state.S.dtype == sdt and state.z.dtype == sdt
        outs.append(o)
    out = np.concatenate(outs)
    tol = tolerance(ref, ref_state.S, v, t, c, ref_state.S.shape[1], cdt, sdt)
    assert float(np.max(np.abs(out - ref))) <= tol
    assert float(np.max(np.abs(state.S - ref_state.S))) <= tol
    assert float(np.max(np.abs(state.z - ref_state.z))) <= tol * max(1.0, t)


@pytest.mark.parametrize("rule", ["decay", "gated", "delta", "gated_delta"])
def test_inputs_and_given_state_are_not_mutated(rule):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((20, 2, 4)) for _ in range(3))
    kw = params(rule, 20, 2, rng)
    st0 = AttentionState(rng.standard_normal((2, 4, 4)), np.abs(rng.standard_normal((2, 4))))
    copies = [x.copy() for x in (q, k, v, st0.S, st0.z, *[a for a in kw.values()])]
    causal_linear_attention(q, k, v, st0, rule=rule, **kw)
    for before, after in zip(copies, (q, k, v, st0.S, st0.z, *kw.values()), strict=True):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("rule", ["decay", "gated", "delta", "gated_delta"])
def test_resume_from_a_nonzero_state_matches_the_reference(rule):
    rng = np.random.default_rng(8)
    print("seed=8")
    q, k, v = (rng.standard_normal((50, 2, 6)) for _ in range(3))
    kw = params(rule, 50, 2, rng)
    st0 = AttentionState(rng.standard_normal((2, 6, 6)), np.abs(rng.standard_normal((2, 6))))
    ref, rs = rule_recurrent(q, k, v, st0, rule=rule, **kw)
    out, st = causal_linear_attention(q, k, v, st0, rule=rule, chunk_size=16, **kw)
    tol = tolerance(ref, rs.S, v, 50, 16, 6, np.float64, np.float64)
    assert float(np.max(np.abs(out - ref))) <= tol
    assert float(np.max(np.abs(st.S - rs.S))) <= tol


def test_delta_rules_carry_z_through_unchanged():
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((10, 1, 3)) for _ in range(3))
    z0 = np.array([[1.0, 2.0, 3.0]])
    _, st = causal_linear_attention(
        q, k, v, AttentionState(np.zeros((1, 3, 3)), z0), rule="delta", beta=np.ones((10, 1))
    )
    np.testing.assert_array_equal(st.z, z0)


def test_gate_of_one_is_the_additive_rule():
    """gated with α = 1 everywhere reproduces the additive kernel's outputs and state."""
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal((70, 2, 5)) for _ in range(3))
    a, sa = causal_linear_attention(q, k, v, backend="numba")
    g, sg = causal_linear_attention(q, k, v, rule="gated", log_alpha=np.zeros((70, 2)))
    tol = tolerance(a, sa.S, v, 70, 64, 5, np.float64, np.float64)
    assert float(np.max(np.abs(a - g))) <= tol
    assert float(np.max(np.abs(sa.S - sg.S))) <= tol


@pytest.mark.parametrize("fmap", ["elu+1", "relu", "identity"])
@pytest.mark.parametrize("rule", ["decay", "gated", "delta", "gated_delta"])
def test_nan_in_a_query_reaches_that_tokens_output(rule, fmap):
    """NaN and Inf propagate (the pipeline dead-letters them before; the op never hides them)."""
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((9, 1, 3)) for _ in range(3))
    q[4, 0, 1] = np.nan
    out, _ = causal_linear_attention(
        q, k, v, rule=rule, feature_map=fmap, **params(rule, 9, 1, rng)
    )
    assert (
        np.all(np.isnan(out[4])) and np.all(np.isfinite(out[:4])) and np.all(np.isfinite(out[5:]))
    )
