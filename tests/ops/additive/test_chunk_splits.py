"""Splitting a sequence into chunks (any split, 1-token chunks included) changes nothing."""

import itertools

import numpy as np
import pytest
from helpers.ops_inputs import BACKENDS, make_qkv, rel_error, token_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops import causal_linear_attention

CASES = [
    (np.float64, np.float64, 1e-11),
    (np.float32, np.float64, 1e-5),
    (np.float32, np.float32, 1e-5),
]
CASE_IDS = ["f64-state64", "f32-state64", "f32-state32"]


@st.composite
def splits(draw):
    """(seed, T, cut points, kernel chunk size); cuts may be adjacent (1-token chunks)."""
    seed = draw(st.integers(0, 2**32 - 1))
    t = draw(st.integers(1, 90))
    cuts = draw(st.lists(st.integers(1, t), max_size=12, unique=True)) if t > 1 else []
    chunk = draw(st.sampled_from([1, 3, 16, 64]))
    return seed, t, sorted(c for c in cuts if c < t), chunk


@pytest.mark.parametrize(("dtype", "state_dtype", "tol"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=splits())
def test_random_splits_equal_one_pass(backend, dtype, state_dtype, tol, case):
    seed, t, cuts, chunk = case
    rng = np.random.default_rng(seed)
    q, k, v = make_qkv(rng, t, 3, 5, 7, dtype=dtype)
    whole, st_whole = causal_linear_attention(
        q, k, v, backend=backend, chunk_size=chunk, state_dtype=state_dtype
    )
    outs, state = [], None
    bounds = [0, *cuts, t]
    for a, b in itertools.pairwise(bounds):
        o, state = causal_linear_attention(
            q[a:b],
            k[a:b],
            v[a:b],
            state,
            backend=backend,
            chunk_size=chunk,
            state_dtype=state_dtype,
        )
        outs.append(o)
    assert state is not None
    assert token_error(np.concatenate(outs), whole.astype(np.float64)) < tol
    assert rel_error(state.S, st_whole.S) < tol
    assert rel_error(state.z, st_whole.z) < tol


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_by_token_equals_one_pass(backend):
    rng = np.random.default_rng(3)
    q, k, v = make_qkv(rng, 40, 2, 4, 6)
    whole, st_whole = causal_linear_attention(q, k, v, backend=backend)
    state = None
    outs = []
    for i in range(40):
        o, state = causal_linear_attention(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], state, backend=backend
        )
        outs.append(o)
    np.testing.assert_allclose(np.concatenate(outs), whole, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(state.S, st_whole.S, rtol=1e-12)


@pytest.mark.parametrize("dims", [(5, 7), (32, 16)], ids=["dk5-dv7-loops", "dk32-dv16-blas"])
def test_backends_agree_on_chunk_size(dims):
    """numpy and numba (its loop and BLAS kernels), any chunk size: the same outputs."""
    rng = np.random.default_rng(9)
    q, k, v = make_qkv(rng, 100, 3, *dims)
    ref, ref_st = causal_linear_attention(q, k, v, backend="numpy", chunk_size=100)
    for backend in ("numpy", "numba"):
        for c in (1, 7, 8, 32, 64, 128):
            out, st = causal_linear_attention(q, k, v, backend=backend, chunk_size=c)
            np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(st.S, ref_st.S, rtol=1e-12, atol=1e-12)
