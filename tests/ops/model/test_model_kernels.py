"""The runtime's fused per-token kernels and its layer-0 projection table vs NumPy in float64."""

import pickle

import numpy as np
import pytest
from linstream.ops import EmbeddingModel, ModelConfig, load_model
from linstream.ops.model.kernels import NumbaOps
from linstream.ops.model.layers import XpOps
from linstream.ops.model.weights import init_weights

# float32 rounding of a result formed in float64 is 2^-24 of it; a norm's output adds the
# rounding of its float32 input to the float64 statistics (a few ulps over d = 2..128 terms)
F32_REL = 8 * 2.0**-24


def _rows(rng, t, d, scale=3.0):
    return (rng.standard_normal((t, d)) * scale + rng.standard_normal(d)).astype(np.float32)


def _assert_close_f32(got, ref):
    err = np.abs(got.astype(np.float64) - ref) / np.maximum(np.abs(ref), 1.0)
    assert err.max() <= F32_REL, float(err.max())


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize(("t", "d"), [(1, 2), (7, 5), (64, 128), (2048, 128)])
def test_fused_norm_and_residual_match_numpy_in_float64(layernorm, t, d):
    seed = 1000 * t + d
    print("seed", seed)
    rng = np.random.default_rng(seed)
    x, r = _rows(rng, t, d), _rows(rng, t, d)
    bias = rng.standard_normal(d).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32) if layernorm else None
    ops, ref_ops = NumbaOps(1e-5), XpOps(np, 1e-5)
    f8 = (w.astype(np.float64), None if b is None else b.astype(np.float64))

    _assert_close_f32(ops.norm(x, (w, b)), ref_ops.norm(x.astype(np.float64), f8))

    x1, x2 = x.copy(), x.copy()
    got = ops.add_norm(x1, r, bias, (w, b))
    expected_x = (x2 + r) + bias  # the residual stream: float32, NumPy's order
    np.testing.assert_array_equal(x1, expected_x)
    _assert_close_f32(got, ref_ops.norm(expected_x.astype(np.float64), f8))
    x3 = x.copy()
    ops.add_norm(x3, r, None, (w, b))
    np.testing.assert_array_equal(x3, x + r)


@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize(("t", "d"), [(3, 5), (64, 512), (1024, 512)])
def test_fused_bias_activation_matches_numpy_in_float64(act, t, d):
    rng = np.random.default_rng(t * d)
    u = _rows(rng, t, d)
    bias = rng.standard_normal(d).astype(np.float32)
    ref = XpOps(np, 1e-5).bias_act(u.astype(np.float64), bias.astype(np.float64), act)
    got = NumbaOps(1e-5).bias_act(u.copy(), bias, act)
    # the float32 exp is ~1 ulp and the sum u + bias rounds once more than the reference
    np.testing.assert_allclose(got, ref, rtol=4e-6, atol=4e-6 * np.abs(u).max())


TOKENS = ModelConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_head=8, d_ff=24)


def test_layer0_table_gives_the_float64_model_to_float32_rounding():
    m32 = EmbeddingModel(TOKENS, init_weights(TOKENS, 3))
    assert m32._host.qkv0 is not None and m32._host.qkv0.shape == (50, 3 * 16)
    m64 = m32.with_compute_dtype(np.float64)
    assert m64._host.qkv0 is None  # the reference mode forms every step
    x = np.random.default_rng(4).integers(0, 50, 200)
    for backend in ("numba", "numpy"):
        e32, s32 = m32.embed_chunk(x, None, backend=backend)
        e64, s64 = m64.embed_chunk(x, None, backend="numpy")
        err = np.linalg.norm(e32 - e64, axis=1) / np.linalg.norm(e64, axis=1)
        assert err.max() < 2e-5, (backend, float(err.max()))
        np.testing.assert_allclose(s32[1].S, s64[1].S, rtol=1e-4, atol=1e-4)


def test_a_pickled_model_forms_its_table_again_and_embeds_the_same():
    m = load_model("builtin:default")
    blob = pickle.dumps(m)
    weights = sum(a.nbytes for a in m.weights.values())  # carried twice: stored and laid out
    assert len(blob) < 2 * weights + m._host.qkv0.nbytes // 2  # the table is not
    back = pickle.loads(blob)
    np.testing.assert_array_equal(back._host.qkv0, m._host.qkv0)
    x = np.arange(0, 4096, 37)
    np.testing.assert_array_equal(back.embed_chunk(x, None)[0], m.embed_chunk(x, None)[0])
