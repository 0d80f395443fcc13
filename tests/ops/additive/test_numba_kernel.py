"""The Numba kernel at the head widths models use (d ∈ {16, 32, 64, 128}, d_k ≠ d_v), on both of
its paths (heads in parallel, heads on the calling thread), against the float64 O(T²) oracle."""

import numpy as np
import pytest
from helpers.ops_inputs import make_qkv, rel_error, token_error
from linstream.ops import causal_linear_attention, numba_tools
from linstream.ops.additive.naive import causal_quadratic

# (d_k, d_v): square widths, both orders of d_k ≠ d_v, and a d_v that is not a multiple of the
# four rows the kernel updates at once (its remainder loop)
WIDTHS = [(16, 16), (32, 32), (64, 64), (128, 128), (64, 32), (32, 128), (16, 7)]
WIDTH_IDS = [f"dk{a}-dv{b}" for a, b in WIDTHS]
# the same tolerances as test_backends_vs_oracle (worst per-token error, state error)
TOL = {np.float32: 2e-4, np.float64: 1e-10}


@pytest.fixture(params=["parallel", "serial"])
def path(request, monkeypatch):
    """Force the kernel onto one path whatever the size of the input."""
    least = 0 if request.param == "parallel" else 1 << 62
    monkeypatch.setattr(numba_tools, "_PARALLEL_MIN_WORK", least)
    return request.param


def _width_params():
    """Every width on the serial path; on the parallel path (same per-head code, heads spread
    over threads) 64×64 and the ragged 16×7 in `make test`, the rest in `make slow`: each
    (width, path) is its own compilation, 7–15 s on a cold cache."""
    fast_parallel = {(64, 64), (16, 7)}
    out = []
    for (dk, dv), wid in zip(WIDTHS, WIDTH_IDS, strict=True):
        for p in ("parallel", "serial"):
            marks = [pytest.mark.slow] if p == "parallel" and (dk, dv) not in fast_parallel else []
            out.append(pytest.param(dk, dv, p, id=f"{p}-{wid}", marks=marks))
    return out


@pytest.mark.parametrize(("dk", "dv", "path"), _width_params(), indirect=["path"])
def test_head_widths_match_oracle_float32(dk, dv, path):
    """T=150 with C=64 leaves a ragged last chunk; float32 inputs, float64 state."""
    rng = np.random.default_rng(dk * 1000 + dv)
    q, k, v = make_qkv(rng, 150, 2, dk, dv, dtype=np.float32, scale=0.5)
    ref, ref_st = causal_quadratic(q, k, v)
    out, st = causal_linear_attention(q, k, v, backend="numba", chunk_size=64)
    assert out.shape == (150, 2, dv) and out.dtype == np.float32
    assert st.S.dtype == np.float64
    assert token_error(out, ref) < TOL[np.float32]
    assert rel_error(st.S, ref_st.S) < TOL[np.float32]
    assert rel_error(st.z, ref_st.z) < TOL[np.float32]


@pytest.mark.parametrize(("dk", "dv"), [(64, 32), (16, 7)], ids=["dk64-dv32", "dk16-dv7"])
@pytest.mark.parametrize("feature_map", ["elu+1", "relu", "identity"])
def test_head_widths_match_oracle_float64(dk, dv, feature_map, path):
    rng = np.random.default_rng(dk + dv)
    q, k, v = make_qkv(rng, 70, 3, dk, dv, feature_map, np.float64, scale=0.5)
    ref, ref_st = causal_quadratic(q, k, v, feature_map=feature_map)
    out, st = causal_linear_attention(
        q, k, v, backend="numba", chunk_size=16, feature_map=feature_map
    )
    assert token_error(out, ref) < TOL[np.float64]
    assert rel_error(st.S, ref_st.S) < TOL[np.float64]
    assert rel_error(st.z, ref_st.z) < TOL[np.float64]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_split_equals_one_pass_at_model_widths(seed, path):
    """dk=64, dv=32, float32: three calls at random cut points give the one-pass result (the
    chunk boundaries move with the cuts, so equal up to float32 rounding inside a chunk)."""
    rng = np.random.default_rng(seed)
    t = 300
    cuts = sorted(rng.choice(np.arange(1, t), size=2, replace=False).tolist())
    print(f"seed={seed} cuts={cuts}")
    q, k, v = make_qkv(rng, t, 4, 64, 32, dtype=np.float32, scale=0.5)
    whole, st_whole = causal_linear_attention(q, k, v, backend="numba", chunk_size=32)
    outs, state = [], None
    for a, b in zip([0, *cuts], [*cuts, t], strict=True):
        o, state = causal_linear_attention(
            q[a:b], k[a:b], v[a:b], state, backend="numba", chunk_size=32
        )
        outs.append(o)
    assert state is not None
    assert token_error(np.concatenate(outs), whole.astype(np.float64)) < 1e-5
    assert rel_error(state.S, st_whole.S) < 1e-5
    assert rel_error(state.z, st_whole.z) < 1e-5


def test_float32_state_stays_float32_and_inputs_unchanged(path):
    rng = np.random.default_rng(4)
    q, k, v = make_qkv(rng, 100, 2, 32, 16, dtype=np.float32)
    copies = [a.copy() for a in (q, k, v)]
    _, st0 = causal_linear_attention(
        q[:50], k[:50], v[:50], backend="numba", state_dtype=np.float32
    )
    s_before, z_before = st0.S.copy(), st0.z.copy()
    out, st = causal_linear_attention(q[50:], k[50:], v[50:], st0, backend="numba")
    assert st.S.dtype == np.float32 and st.z.dtype == np.float32
    for a, b in zip((q, k, v), copies, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(st0.S, s_before)
    np.testing.assert_array_equal(st0.z, z_before)
    ref, _ = causal_quadratic(q, k, v)
    assert token_error(out, ref[50:]) < TOL[np.float32]


# -- the model's feed-forward activation (backend "numba") ---------------------------------------
@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("rows", [3, 2048], ids=["serial", "parallel"])
def test_numba_activation_matches_numpy(act, rows):
    """The fused one-pass activation against the runtime's NumPy one, far tails included."""
    from linstream.ops.model.kernels import NumbaOps
    from linstream.ops.model.runtime import _activation

    rng = np.random.default_rng(rows)
    u = (rng.standard_normal((rows, 512)) * 4).astype(np.float32)
    u[0, :6] = [-100.0, -30.0, -1e-4, 0.0, 30.0, 100.0]
    expected = _activation(np, u.astype(np.float64), act)
    got = NumbaOps(1e-5).bias_act(u.copy(), None, act)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh"])
def test_model_with_numba_backend_matches_numpy_backend(act):
    from linstream.ops import EmbeddingModel, ModelConfig
    from linstream.ops.model.weights import init_weights

    config = ModelConfig(
        vocab_size=50, d_model=32, n_layers=2, n_heads=2, d_head=16, d_ff=64, activation=act
    )
    model = EmbeddingModel(config, init_weights(config, 1))
    x = np.random.default_rng(2).integers(0, 50, 300)
    e_nb, s_nb = model.embed_chunk(x, None, backend="numba")
    e_np, s_np = model.embed_chunk(x, None, backend="numpy")
    np.testing.assert_allclose(e_nb, e_np, rtol=1e-4, atol=1e-5)
    for a, b in zip(s_nb, s_np, strict=True):
        assert rel_error(a.S, b.S) < 1e-5


def test_zero_denominator_gives_nan_like_numpy(path):
    """eps=0 and φ(k) = 0 (identity map, zero keys): 0/0 per token, NaN as NumPy gives, no
    exception (the pipeline's warm-up call runs exactly this)."""
    x = np.zeros((2, 1, 2), dtype=np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref, _ = causal_linear_attention(x, x, x, feature_map="identity", eps=0.0, backend="numpy")
    out, st = causal_linear_attention(x, x, x, feature_map="identity", eps=0.0, backend="numba")
    assert np.isnan(ref).all()
    assert np.isnan(out).all()
    np.testing.assert_array_equal(st.z, 0.0)
