"""Every backend against the float64 O(T²) oracle: shapes, dtypes, feature maps, state dtypes."""

import numpy as np
import pytest
from helpers.ops_inputs import BACKENDS, make_qkv, rel_error, token_error
from linstream.ops import AttentionState, causal_linear_attention, linear_attention
from linstream.ops.additive.naive import causal_quadratic, causal_recurrent, noncausal_quadratic

FEATURE_MAPS = ["elu+1", "relu", "identity", {"name": "favor+", "num_features": 12, "seed": 3}]
FM_IDS = ["elu1", "relu", "identity", "favor12"]
SHAPES = [(1, 3, 5, 7), (63, 3, 5, 7), (1000, 3, 5, 7), (130, 2, 16, 24)]
SHAPE_IDS = [f"T{t}-H{h}-dk{dk}-dv{dv}" for t, h, dk, dv in SHAPES]
# (input dtype, state dtype, tolerance on the worst per-token output error and on the state)
PRECISIONS = [
    (np.float64, np.float64, 1e-10),
    (np.float64, np.float32, 1e-5),
    (np.float32, np.float64, 2e-4),
    (np.float32, np.float32, 2e-4),
]
PREC_IDS = ["f64-state64", "f64-state32", "f32-state64", "f32-state32"]


def _fm_name(fm):
    return fm["name"] if isinstance(fm, dict) else fm


@pytest.mark.parametrize(("dtype", "state_dtype", "tol"), PRECISIONS, ids=PREC_IDS)
@pytest.mark.parametrize("feature_map", FEATURE_MAPS, ids=FM_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_quadratic_oracle(backend, shape, feature_map, dtype, state_dtype, tol):
    t, h, dk, dv = shape
    rng = np.random.default_rng(t * 1000 + dk)
    q, k, v = make_qkv(rng, t, h, dk, dv, _fm_name(feature_map), dtype)
    ref, ref_st = causal_quadratic(q, k, v, feature_map=feature_map)
    out, st = causal_linear_attention(
        q, k, v, feature_map=feature_map, backend=backend, state_dtype=state_dtype, chunk_size=16
    )
    assert out.shape == (t, h, dv)
    assert out.dtype == dtype
    assert st.S.dtype == state_dtype and st.z.dtype == state_dtype
    assert token_error(out, ref) < tol
    assert rel_error(st.S, ref_st.S) < tol
    assert rel_error(st.z, ref_st.z) < tol


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_continues_from_a_given_state(backend, dtype):
    """A non-zero initial state (as after an earlier chunk) is read and carried."""
    rng = np.random.default_rng(7)
    q, k, v = make_qkv(rng, 50, 3, 5, 7, dtype=dtype)
    s0 = AttentionState(rng.standard_normal((3, 5, 7)), rng.uniform(1.0, 5.0, (3, 5)))
    ref, ref_st = causal_quadratic(q, k, v, s0)
    out, st = causal_linear_attention(q, k, v, s0, backend=backend, chunk_size=8)
    tol = 1e-10 if dtype == np.float64 else 2e-4
    assert token_error(out, ref) < tol
    assert rel_error(st.S, ref_st.S) < tol
    assert rel_error(st.z, ref_st.z) < tol


def test_oracles_agree():
    rng = np.random.default_rng(0)
    q, k, v = make_qkv(rng, 40, 2, 4, 3)
    a, sa = causal_quadratic(q, k, v)
    b, sb = causal_recurrent(q, k, v)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sa.S, sb.S, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS, ids=FM_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_noncausal_matches_unmasked_oracle(backend, feature_map, dtype):
    rng = np.random.default_rng(11)
    q, k, v = make_qkv(rng, 63, 3, 5, 7, _fm_name(feature_map), dtype)
    ref = noncausal_quadratic(q, k, v, feature_map=feature_map)
    out = linear_attention(q, k, v, feature_map=feature_map, backend=backend)
    assert out.shape == (63, 3, 7) and out.dtype == dtype
    assert token_error(out, ref) < (1e-10 if dtype == np.float64 else 2e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eps_zero_is_allowed_and_used(backend):
    rng = np.random.default_rng(5)
    q, k, v = make_qkv(rng, 20, 2, 4, 3)
    for eps in (0.0, 0.5):
        ref, _ = causal_quadratic(q, k, v, eps=eps)
        out, _ = causal_linear_attention(q, k, v, eps=eps, backend=backend)
        assert token_error(out, ref) < 1e-10
