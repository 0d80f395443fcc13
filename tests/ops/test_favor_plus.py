"""FAVOR+: positive orthogonal random features for the softmax kernel, causally stabilized."""

import itertools
import json

import numpy as np
import pytest
from helpers.ops_inputs import BACKENDS
from linstream.ops import causal_linear_attention, get_feature_map
from linstream.ops.backend import cupy_available
from linstream.ops.feature_maps import FavorPlus


def softmax_causal(q, k, v):
    """Exact causal softmax attention, exp(q·k/sqrt(d)) weights, float64."""
    t, _, d = q.shape
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(d)
    s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("hts,shd->thd", w, v)


def test_error_vs_softmax_shrinks_as_features_grow():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((64, 2, 8)) * 0.7
    k = rng.standard_normal((64, 2, 8)) * 0.7
    v = rng.standard_normal((64, 2, 4))
    ref = softmax_causal(q, k, v)
    errors = []
    for m in (8, 64, 512, 4096):
        per_seed = []
        for seed in range(4):
            fm = {"name": "favor+", "num_features": m, "seed": seed}
            out, _ = causal_linear_attention(q, k, v, feature_map=fm, eps=0.0, backend="numpy")
            per_seed.append(np.sqrt(np.mean((out - ref) ** 2)))
        errors.append(float(np.mean(per_seed)))
    assert all(b < a for a, b in itertools.pairwise(errors)), errors
    assert errors[-1] < errors[0] / 4, errors


def test_kernel_estimate_is_unbiased_in_expectation():
    """mean over many features of φ(q)·φ(k) ≈ exp(q·k/sqrt(d)) (Performer's lemma)."""
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal(6) * 0.5, rng.standard_normal(6) * 0.5
    fm = FavorPlus(num_features=60000, seed=2)
    est = float((fm(k[None]) @ fm(q[None]).T)[0, 0])
    assert est == pytest.approx(np.exp(q @ k / np.sqrt(6)), rel=0.02)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefix_outputs_do_not_change_when_tokens_are_appended(backend):
    """Causal: no statistic of later tokens (e.g. a key max over the sequence) may enter."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((80, 2, 6)) * 2.0 for _ in range(3))
    k[60:] *= 5.0  # later keys with a much larger norm: a sequence-wide key max would move
    fm = {"name": "favor+", "num_features": 24, "seed": 5}
    full, _ = causal_linear_attention(q, k, v, feature_map=fm, backend=backend)
    for p in (1, 30, 60):
        pre, _ = causal_linear_attention(q[:p], k[:p], v[:p], feature_map=fm, backend=backend)
        np.testing.assert_allclose(full[:p], pre, rtol=1e-12, atol=1e-14)


def test_query_stabilizer_cancels_in_the_ratio():
    """`query` rescales each token by its own max; outputs equal those of the plain features."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((10, 3, 5)) * 3
    fm = FavorPlus(num_features=20, seed=1)
    a, b = fm(x), fm.query(x)
    ratio = a / b
    np.testing.assert_allclose(ratio, ratio[..., :1] * np.ones_like(ratio), rtol=1e-10)
    assert np.all(b <= 20**-0.5 + 1e-15) and np.all(b > 0)


def test_matrix_is_deterministic_and_orthogonal_in_blocks():
    a = FavorPlus(num_features=20, seed=3).matrix(8)
    b = FavorPlus(num_features=20, seed=3).matrix(8)
    c = FavorPlus(num_features=20, seed=4).matrix(8)
    assert a.shape == (20, 8) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for block in (a[0:8], a[8:16], a[16:20]):
        unit = block / np.linalg.norm(block, axis=1, keepdims=True)
        np.testing.assert_allclose(unit @ unit.T, np.eye(len(block)), atol=1e-6)
    # (d_in, m, seed) together pick the matrix: another width is another matrix
    assert FavorPlus(num_features=20, seed=3).matrix(9).shape == (20, 9)


def test_config_rebuilds_the_same_map():
    fm = get_feature_map({"name": "favor+", "num_features": 64, "seed": 1})
    assert isinstance(fm, FavorPlus)
    cfg = json.loads(json.dumps(fm.config()))
    assert cfg == {"name": "favor+", "num_features": 64, "seed": 1}
    again = get_feature_map(cfg)
    np.testing.assert_array_equal(again.params(16)["W"], fm.params(16)["W"])
    assert fm.out_dim(16) == 64
    assert FavorPlus().out_dim(16) == 16  # None: as many features as inputs
    assert get_feature_map("favor+").config() == {"name": "favor+", "num_features": None, "seed": 0}


@pytest.mark.parametrize(
    "cfg",
    [
        {"name": "favor+", "num_features": 0},
        {"name": "favor+", "num_features": 2.5},
        {"name": "favor+", "seed": -1},
        {"name": "favor+", "bogus": 1},
        {"name": "nope"},
    ],
    ids=["zero-features", "fractional-features", "negative-seed", "unknown-param", "unknown-map"],
)
def test_bad_configs_are_rejected(cfg):
    with pytest.raises(ValueError, match=r"favor\+|feature map"):
        get_feature_map(cfg)


def test_features_are_positive_and_finite_for_large_inputs():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((50, 2, 16)).astype(np.float32) * 100
    fm = FavorPlus(num_features=32, seed=0)
    for y in (fm(x), fm.query(x)):
        assert y.dtype == np.float32 and np.all(np.isfinite(y)) and np.all(y >= 0)


@pytest.mark.skipif(not cupy_available(), reason="no CUDA device")
def test_runs_with_cupy_namespace():
    import cupy

    rng = np.random.default_rng(9)
    x = rng.standard_normal((7, 2, 5))
    fm = FavorPlus(num_features=11, seed=2)
    np.testing.assert_allclose(
        cupy.asnumpy(fm.query(cupy.asarray(x), xp=cupy)), fm.query(x), rtol=1e-10
    )
