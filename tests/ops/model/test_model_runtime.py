"""The streaming runtime without torch: inputs and states checked, chunk splits, built-in model."""

import itertools
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers.models import TOKENS_SMALL
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.ops import (
    AttentionState,
    EmbeddingModel,
    ModelConfig,
    builtin_models,
    load_model,
)
from linstream.ops.model.builtin import BUILTIN_SPECS, build
from linstream.ops.model.weights import fingerprint, init_weights

TOKENS = TOKENS_SMALL
FEATURES = ModelConfig(
    input_kind="features",
    vocab_size=None,
    input_dim=3,
    d_model=8,
    n_layers=2,
    n_heads=2,
    d_head=4,
    d_ff=12,
    normalization="rmsnorm",
    activation="silu",
)


@pytest.fixture(scope="module")
def tok_model():
    return EmbeddingModel(TOKENS, init_weights(TOKENS, 0))


@pytest.fixture(scope="module")
def feat_model():
    return EmbeddingModel(FEATURES, init_weights(FEATURES, 0))


# -- the built-in model -------------------------------------------------------------------------
def test_builtin_default_loads_and_embeds():
    assert "default" in builtin_models()
    m = load_model("builtin:default")
    c = m.config
    assert (c.input_kind, c.vocab_size, c.d_model, c.n_layers, c.n_heads) == (
        "tokens",
        4096,
        128,
        2,
        4,
    )
    assert m.state_shape == (2, 4, 32, 32)
    tokens = np.arange(0, 4096, 97, dtype=np.int32)
    emb, states = m.embed_chunk(tokens, m.initial_states(), backend="numpy")
    assert emb.shape == (tokens.size, 128)
    assert emb.dtype == np.float32
    assert np.isfinite(emb).all()
    assert len(states) == 2
    assert all(s.S.dtype == np.float64 and s.S.shape == (4, 32, 32) for s in states)


def test_builtin_script_reproduces_the_shipped_file():
    config, weights = build("default")
    shipped = load_model("builtin:default")
    assert shipped.config == config
    assert shipped.fingerprint == fingerprint(config, weights)
    assert set(BUILTIN_SPECS) == set(builtin_models())


def test_builtin_script_check_mode_passes():
    from linstream.ops.model.builtin import main

    assert main(["--check"]) == 0


def test_unknown_builtin_name_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"unknown built-in model 'nope'; available: \['default'"):
        load_model("builtin:nope")
    with pytest.raises(ValueError, match="unknown built-in model"):
        load_model("builtin:../builtin/default")


def test_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"expected builtin:NAME, a \.safetensors model"):
        load_model(tmp_path / "absent.safetensors")


# -- chunk splits (runtime alone; the twin comparison is in test_model_torch.py) ----------------
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["tokens", "features"]))
def test_any_split_gives_the_same_embeddings(seed, kind):
    rng = np.random.default_rng(seed)
    cfg = TOKENS if kind == "tokens" else FEATURES
    m = EmbeddingModel(cfg, init_weights(cfg, int(rng.integers(1000))), compute_dtype=np.float64)
    t = int(rng.integers(1, 50))
    x = rng.integers(0, 13, t) if kind == "tokens" else rng.standard_normal((t, 3))
    whole, whole_states = m.embed_chunk(x, None, backend="numpy")
    cuts = (
        np.sort(
            rng.choice(np.arange(1, t), size=min(t - 1, int(rng.integers(0, 6))), replace=False)
        )
        if t > 1
        else []
    )
    bounds = [0, *[int(c) for c in cuts], t]
    states = m.initial_states()
    parts = []
    for a, b in itertools.pairwise(bounds):
        e, states = m.embed_chunk(x[a:b], states, backend="numpy")
        parts.append(e)
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-12, atol=1e-12)
    for s1, s2 in zip(states, whole_states, strict=True):
        np.testing.assert_allclose(s1.S, s2.S, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s1.z, s2.z, rtol=1e-12, atol=1e-12)


def test_embed_chunk_leaves_inputs_and_states_alone(tok_model):
    x = np.array([1, 2, 3], dtype=np.int64)
    states = tok_model.initial_states()
    e1, s1 = tok_model.embed_chunk(x, states, backend="numpy")
    assert all(not s.S.any() and not s.z.any() for s in states)
    e2, _ = tok_model.embed_chunk(x, s1, backend="numpy")
    e3, _ = tok_model.embed_chunk(x, s1, backend="numpy")
    np.testing.assert_array_equal(e2, e3)
    assert not np.array_equal(e1, e2)  # the state carries the past


def test_float32_state_is_kept(tok_model):
    _, states = tok_model.embed_chunk(np.array([1, 2]), tok_model.initial_states(np.float32))
    assert all(s.S.dtype == np.float32 and s.z.dtype == np.float32 for s in states)


def test_default_backend_matches_numpy(tok_model):
    x = np.arange(13).repeat(5)
    e_auto, s_auto = tok_model.embed_chunk(x, None)
    e_np, s_np = tok_model.embed_chunk(x, None, backend="numpy")
    np.testing.assert_allclose(e_auto, e_np, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s_auto[1].S, s_np[1].S, rtol=1e-5, atol=1e-5)


# -- input checks -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("inputs", "exc", "words"),
    [
        (
            np.array([1, 13, 2]),
            ValueError,
            r"unknown token id 13 at position 1: .* 13 ids \(0 to 12\)",
        ),
        (np.array([-1]), ValueError, "unknown token id -1 at position 0"),
        (np.array([1.0, 2.0]), TypeError, "token ids must be an integer array.*float64"),
        (np.array([True]), TypeError, "integer array.*bool"),
        (np.array([[1, 2]]), ValueError, r"1-D \[T\], got shape \(1, 2\)"),
        (np.array([], dtype=np.int64), ValueError, "empty chunk"),
        ([1, 2], TypeError, "NumPy array, got list"),
    ],
    ids=["too-big", "negative", "float", "bool", "2d", "empty", "list"],
)
def test_token_inputs_are_checked(tok_model, inputs, exc, words):
    with pytest.raises(exc, match=words):
        tok_model.check_inputs(inputs)
    with pytest.raises(exc, match=words):
        tok_model.embed_chunk(inputs, tok_model.initial_states())


@pytest.mark.parametrize(
    ("inputs", "exc", "words"),
    [
        (np.zeros((4, 5), np.float32), ValueError, r"\[T, 3\], got shape \(4, 5\)"),
        (np.zeros(3, np.float32), ValueError, r"\[T, 3\]"),
        (np.zeros((4, 3), np.int32), TypeError, "floating array.*int32"),
        (np.array([[0, 1, np.nan]], np.float32), ValueError, "found nan at row 0, column 2"),
        (np.array([[0, 1, 2], [np.inf, 0, 0]], np.float32), ValueError, "inf at row 1, column 0"),
        (np.zeros((0, 3), np.float32), ValueError, "empty chunk"),
    ],
    ids=["width", "1d", "int", "nan", "inf", "empty"],
)
def test_feature_inputs_are_checked(feat_model, inputs, exc, words):
    with pytest.raises(exc, match=words):
        feat_model.check_inputs(inputs)
    with pytest.raises(exc, match=words):
        feat_model.embed_chunk(inputs, None)


def test_good_inputs_pass_the_check(tok_model, feat_model):
    tok_model.check_inputs(np.array([0, 12], dtype=np.uint8))
    feat_model.check_inputs(np.ones((2, 3), np.float32))


def test_states_are_checked(tok_model):
    x = np.array([1])
    good = tok_model.initial_states()
    with pytest.raises(ValueError, match="one AttentionState per layer"):
        tok_model.embed_chunk(x, good[:1])
    with pytest.raises(TypeError, match="list of 2 AttentionState"):
        tok_model.embed_chunk(x, good[0])
    bad = [good[0], AttentionState.zeros(2, 4, 5)]
    with pytest.raises(ValueError, match=r"states\[1\] has S \(2, 4, 5\)"):
        tok_model.embed_chunk(x, bad)
    ints = [good[0], AttentionState(good[1].S.astype(np.int64), good[1].z.astype(np.int64))]
    with pytest.raises(TypeError, match=r"states\[1\].S must be float32 or float64"):
        tok_model.embed_chunk(x, ints)


def test_weights_are_read_only_and_compute_dtype_keeps_the_fingerprint(tok_model):
    with pytest.raises(ValueError, match="read-only"):
        tok_model.weights["embed.weight"][0, 0] = 1.0
    m64 = tok_model.with_compute_dtype(np.float64)
    assert m64.fingerprint == tok_model.fingerprint
    e64, _ = m64.embed_chunk(np.array([1, 2, 3]), None)
    assert e64.dtype == np.float64
    with pytest.raises(TypeError, match="compute_dtype"):
        tok_model.with_compute_dtype(np.float16)


# -- no torch at runtime ------------------------------------------------------------------------
NO_TORCH = textwrap.dedent(
    """
    import sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"import of {name} blocked by the test")
            return None

    sys.meta_path.insert(0, BlockTorch())
    import numpy as np
    from linstream.ops import load_model

    m = load_model("builtin:default")
    emb, states = m.embed_chunk(np.arange(50), m.initial_states())
    emb2, _ = m.embed_chunk(np.arange(50), states, backend="numpy")
    assert emb.shape == (50, 128) and np.isfinite(emb2).all()
    assert not any(k == "torch" or k.startswith("torch.") for k in sys.modules), "torch imported"
    try:
        import linstream.ops.model.twin  # noqa: F401
    except ImportError as ex:
        print("model_torch refused:", ex)
    else:
        raise SystemExit("model_torch imported although torch is blocked")
    print("ok", m.fingerprint)
    """
)


def test_runtime_imports_and_runs_without_torch():
    r = subprocess.run(
        [sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok " in r.stdout
    assert "blocked by the test" in r.stdout
