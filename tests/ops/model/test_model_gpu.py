"""The model runtime on a CUDA device (backend="cupy") against the host runtime (backend="numpy").

Skipped as a whole (the reason is printed by `-ra`) where CuPy sees no usable device.  The same
code path runs on the CPU with NumPy stand-ins in test_model_device.py.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.backend import cupy_unavailable_reason

_REASON = cupy_unavailable_reason()
if _REASON is not None:
    pytest.skip(f"model GPU tests need a CUDA device: {_REASON}", allow_module_level=True)

import cupy as cp  # noqa: E402  (only importable as a device library past the skip)
from linstream.ops import AttentionState, EmbeddingModel, ModelConfig, load_model  # noqa: E402
from linstream.ops.model.weights import init_weights  # noqa: E402

pytestmark = pytest.mark.gpu

FEATURES = ModelConfig(
    input_kind="features",
    vocab_size=None,
    input_dim=5,
    d_model=32,
    n_layers=3,
    n_heads=4,
    d_head=8,
    d_ff=64,
    normalization="rmsnorm",
    activation="silu",
)


@pytest.fixture(scope="module")
def builtin() -> EmbeddingModel:
    return load_model("builtin:default")


def _splits(rng: np.random.Generator, t: int) -> list[int]:
    k = min(t - 1, int(rng.integers(0, 6)))
    cuts = np.sort(rng.choice(np.arange(1, t), size=k, replace=False)) if k else []
    return [0, *[int(c) for c in cuts], t]


def _close_states(a: Any, b: Any, rtol: float, atol: float) -> None:
    for s1, s2 in zip(a, b, strict=True):
        np.testing.assert_allclose(s1.S, s2.S, rtol=rtol, atol=atol)
        np.testing.assert_allclose(s1.z, s2.z, rtol=rtol, atol=atol)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), device_states=st.booleans())
def test_builtin_cupy_equals_numpy_over_random_splits(builtin, seed, device_states):
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 700))
    x = rng.integers(0, builtin.config.vocab_size, t)
    ref, ref_states = builtin.embed_chunk(x, None, backend="numpy")
    states: Any = builtin.initial_states()
    if device_states:
        states = builtin.to_device_states(states)
    parts = []
    for a, b in itertools.pairwise(_splits(rng, t)):
        e, states = builtin.embed_chunk(x[a:b], states, backend="cupy")
        assert isinstance(e, np.ndarray) and e.dtype == np.float32
        kind = cp.ndarray if device_states else np.ndarray
        assert all(isinstance(s.S, kind) and isinstance(s.z, kind) for s in states)
        parts.append(e)
    # float32 compute: cuBLAS vs BLAS and the float64 scan differ in summation order only
    np.testing.assert_allclose(np.concatenate(parts), ref, rtol=2e-4, atol=2e-4)
    host = builtin.to_host_states(states)
    assert all(type(s.S) is np.ndarray and s.S.dtype == np.float64 for s in host)
    _close_states(host, ref_states, 1e-4, 1e-4)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), state_dtype=st.sampled_from(["float64", "float32"]))
def test_features_model_float64_compute_is_tight(seed, state_dtype):
    rng = np.random.default_rng(seed)
    m = EmbeddingModel(FEATURES, init_weights(FEATURES, int(rng.integers(1000))))
    m64 = m.with_compute_dtype(np.float64)
    t = int(rng.integers(1, 300))
    x = rng.standard_normal((t, 5))
    ref, ref_states = m64.embed_chunk(x, m64.initial_states(state_dtype), backend="numpy")
    states = m64.initial_states(state_dtype)
    parts = []
    for a, b in itertools.pairwise(_splits(rng, t)):
        e, states = m64.embed_chunk(x[a:b], states, backend="cupy")
        parts.append(e)
    tol = 1e-9 if state_dtype == "float64" else 1e-5
    np.testing.assert_allclose(np.concatenate(parts), ref, rtol=tol, atol=tol)
    assert all(s.S.dtype == np.dtype(state_dtype) for s in states)
    _close_states(states, ref_states, tol, tol)


def test_weights_uploaded_once_and_embed_keeps_states_on_device(monkeypatch):
    monkeypatch.delenv("LINSTREAM_BACKEND", raising=False)
    m = load_model("builtin:default")
    x = np.random.default_rng(0).integers(0, m.config.vocab_size, 1000)
    e1 = m.embed(x, chunk_size=130, backend="cupy")
    assert len(m._device_weights) == 1
    w = next(iter(m._device_weights.values()))
    e2, _ = m.embed_chunk(x[:10], None, backend="auto")  # auto picks the device here
    assert next(iter(m._device_weights.values())) is w
    np.testing.assert_allclose(e1, m.embed(x, backend="numpy"), rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(e2, e1[:10], rtol=2e-4, atol=2e-4)


def test_device_states_are_not_copied_and_inputs_untouched(builtin):
    x = np.arange(40)
    dst = builtin.to_device_states(builtin.initial_states())
    before = [(s.S.copy(), s.z.copy()) for s in dst]
    _, new = builtin.embed_chunk(x, dst, backend="cupy")
    for (s0, z0), s in zip(before, dst, strict=True):
        assert bool(cp.array_equal(s.S, s0)) and bool(cp.array_equal(s.z, z0))
    assert all(isinstance(s.S, cp.ndarray) for s in new)
    with pytest.raises(TypeError, match="to_host_states"):
        builtin.embed_chunk(x, new, backend="numpy")
    mixed = [new[0], AttentionState(*(cp.asnumpy(a) for a in new[1]))]
    with pytest.raises(TypeError, match="mix host and device"):
        builtin.embed_chunk(x, mixed, backend="cupy")


@pytest.mark.parametrize("eps", [1e-3, 0.0])
def test_favor_plus_with_a_key_shift_on_the_device_equals_the_host(eps):
    """FAVOR+ with b = max(0, B - 60) ≈ 24 (d_head = 128): eps must be applied in the unscaled
    domain on the device as on the host (ops/model/device.py); the CPU tests check the same
    function through NumPy stand-ins (test_model_device.py)."""
    cfg = ModelConfig(
        input_kind="features", vocab_size=None, input_dim=3, d_model=8, n_layers=2, n_heads=1,
        d_head=128, d_ff=12, feature_map={"name": "favor+", "num_features": 128, "seed": 0},
        eps=eps,
    )  # fmt: skip
    m = EmbeddingModel(cfg, init_weights(cfg, 3))
    x = np.random.default_rng(4).standard_normal((40, 3)).astype(np.float32) * 2
    ref, _ = m.embed_chunk(x, None, backend="numpy")
    states: Any = m.initial_states()
    parts = []
    for a, b in itertools.pairwise([0, 1, 17, 40]):
        e, states = m.embed_chunk(x[a:b], states, backend="cupy")
        parts.append(e)
    np.testing.assert_allclose(np.concatenate(parts), ref, rtol=2e-4, atol=2e-4)


def test_a_model_with_rule_layers_is_refused_on_cupy_and_auto_stays_on_the_host():
    cfg = dataclasses.replace(FEATURES, rules=["additive", "gated_delta", "decay"])
    m = EmbeddingModel(cfg, init_weights(cfg, 0))
    x = np.random.default_rng(0).standard_normal((9, 5)).astype(np.float32)
    with pytest.raises(ValueError, match="no CuPy kernel"):
        m.embed_chunk(x, None, backend="cupy")
    emb, states = m.embed_chunk(x, None, backend="auto")
    assert all(isinstance(s.S, np.ndarray) for s in states)
    np.testing.assert_array_equal(emb, m.embed_chunk(x, None, backend="numba")[0])
