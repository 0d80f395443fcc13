"""The model runtime's device path, run on the CPU: the same `forward_chunk` and
`_embed_chunk_on` that backend="cupy" runs, with NumPy stand-ins for the device.

- `_NumpyDevice`: xp = numpy, attention through `scan_causal` with `NumpyKernels` (the CuPy
  backend's algorithm as array code).  Its results must equal the host path's.
- `_StandInDevice`: xp = a recording wrapper around NumPy whose arrays are `_Dev`, an ndarray
  subclass that behaves like a CuPy array where it matters here: an operation mixing it with a
  host ndarray raises TypeError (as CuPy does), reading values on the host (item, float,
  bool, tolist) raises, and results stay `_Dev`.  The only ways across are the device's
  `to_device` / `to_host`, which are counted.  So a host array slipping into the forward (a
  weight left on the host, an np.asarray of an activation) fails the test, and the counts
  show what crosses per chunk.

The same comparisons on a real device are in test_model_gpu.py (skipped without one).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, ClassVar

import numpy as np
import pytest
from helpers.cuda_emu import EmuLauncher, compiler_missing
from helpers.models import TOKENS_SMALL
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.ops import AttentionState, EmbeddingModel, ModelConfig, load_model
from linstream.ops.additive.cupy import NumpyKernels, scan_causal
from linstream.ops.attention import causal_linear_attention
from linstream.ops.backend import cupy_available
from linstream.ops.model.device import _CupyDevice, _Device, exact_eps_attend
from linstream.ops.model.layers import forward_chunk as _forward_chunk
from linstream.ops.model.weights import init_weights

TOKENS = TOKENS_SMALL
FEATURES = ModelConfig(
    input_kind="features",
    vocab_size=None,
    input_dim=3,
    d_model=8,
    n_layers=3,
    n_heads=2,
    d_head=4,
    d_ff=12,
    normalization="rmsnorm",
    activation="silu",
)
RELU = ModelConfig(
    vocab_size=13, d_model=8, n_layers=2, n_heads=2, d_head=4, d_ff=12, activation="relu"
)
CONFIGS = {"tokens": TOKENS, "features": FEATURES, "relu": RELU}


# -- stand-in devices ------------------------------------------------------------------------
class _NumpyDevice(_Device):
    """The device path with plain NumPy: copies are real copies, attention is the CuPy
    backend's scan algorithm (`scan_causal`, NumpyKernels) on NumPy arrays."""

    xp = np

    def __init__(self, chunk_size: int = 64) -> None:
        self.chunk_size = chunk_size

    def cache_key(self) -> Any:
        return ("numpy-device", self.chunk_size)

    def is_device(self, a: Any) -> bool:
        return False  # NumPy is the host too: states given are treated as host states

    def to_device(self, a: np.ndarray) -> Any:
        return np.array(a, copy=True)

    def to_host(self, a: Any) -> np.ndarray:
        return np.array(a, copy=True)

    def causal(self, q, k, v, state, *, feature_map, eps, dtype):
        return scan_causal(
            q,
            k,
            v,
            state,
            feature_map=feature_map,
            eps=eps,
            chunk_size=self.chunk_size,
            dtype=dtype,
            xp=np,
            kernels=NumpyKernels(np),
        )

    def attend(self, q, k, v, state, *, feature_map, eps):  # as _CupyDevice.attend
        return exact_eps_attend(
            q, k, v, state, feature_map=feature_map, eps=eps, causal=self.causal, xp=np,
            to_host=self.to_host,
        )  # fmt: skip


class HostReadError(TypeError):
    pass


def _unwrap(x: Any) -> Any:
    """Arguments of an operation on `_Dev` arrays: a host ndarray among them is an error."""
    if isinstance(x, _Dev):
        return x.view(np.ndarray)
    if isinstance(x, np.ndarray):
        msg = f"host ndarray {x.shape} {x.dtype} mixed into a device operation"
        raise TypeError(msg)
    if type(x) in (list, tuple):
        return type(x)(_unwrap(y) for y in x)
    if isinstance(x, dict):
        return {k: _unwrap(y) for k, y in x.items()}
    return x


def _wrap(x: Any) -> Any:
    if isinstance(x, np.generic):  # a reduction's result: a 0-d device array, as in CuPy
        return np.asarray(x).view(_Dev)
    if isinstance(x, np.ndarray) and not isinstance(x, _Dev):
        return x.view(_Dev)
    if type(x) in (list, tuple):
        return type(x)(_wrap(y) for y in x)
    return x


class _Dev(np.ndarray):
    """A NumPy array standing for a device array (see the module docstring)."""

    ufuncs: ClassVar[collections.Counter[str]] = collections.Counter()

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _Dev.ufuncs[f"{ufunc.__name__}.{method}"] += 1
        args = _unwrap(inputs)
        if out is not None:
            kwargs["out"] = _unwrap(out)
        res = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(res)

    def __array_function__(self, func, types, args, kwargs):
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __getitem__(self, key):
        res = np.ndarray.__getitem__(self.view(np.ndarray), _unwrap(key))
        return _wrap(np.asarray(res) if isinstance(res, np.generic) else res)  # 0-d, as CuPy

    def __setitem__(self, key, value):
        np.ndarray.__setitem__(self.view(np.ndarray), _unwrap(key), _unwrap(value))

    def _host_read(self, *args: Any, **kwargs: Any) -> Any:
        msg = "reading a device array's values on the host"
        raise HostReadError(msg)

    item = tolist = __float__ = __int__ = __bool__ = __index__ = _host_read


class _RecordingXp:
    """numpy as a device namespace: arguments must be `_Dev` (or scalars), results are `_Dev`;
    counts the functions called."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr  # dtypes (xp.float32, xp.uint32), constants

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "asarray" and type(args[0]) is np.ndarray:  # an upload, as in CuPy
                return _wrap(np.array(args[0], dtype=kwargs.get("dtype")))
            return _wrap(attr(*_unwrap(args), **_unwrap(kwargs)))

        return call


class _StandInDevice(_Device):
    """A device whose arrays are `_Dev`; transfers are counted by direction."""

    def __init__(self, chunk_size: int = 64) -> None:
        self.xp = _RecordingXp()
        self.chunk_size = chunk_size
        self.moves: list[tuple[str, tuple[int, ...]]] = []

    def cache_key(self) -> Any:
        return ("stand-in", id(self))

    def is_device(self, a: Any) -> bool:
        return isinstance(a, _Dev)

    def to_device(self, a: np.ndarray) -> Any:
        assert type(a) is np.ndarray, f"to_device got {type(a).__name__}"
        self.moves.append(("up", a.shape))
        return np.array(a, copy=True).view(_Dev)

    def to_host(self, a: Any) -> np.ndarray:
        assert isinstance(a, _Dev), f"to_host got {type(a).__name__}, not a device array"
        self.moves.append(("down", a.shape))
        return np.array(a.view(np.ndarray), copy=True)

    def causal(self, q, k, v, state, *, feature_map, eps, dtype):
        for name, x in (("q", q), ("k", k), ("v", v), ("S", state.S), ("z", state.z)):
            assert isinstance(x, _Dev), f"attention got a host {name}"
        out, new = scan_causal(
            q,
            k,
            v,
            state,
            feature_map=feature_map,
            eps=eps,
            chunk_size=self.chunk_size,
            dtype=dtype,
            xp=self.xp,
            kernels=NumpyKernels(self.xp),
        )
        assert isinstance(out, _Dev) and isinstance(new.S, _Dev) and isinstance(new.z, _Dev)
        return out, new

    def attend(self, q, k, v, state, *, feature_map, eps):  # as _CupyDevice.attend
        out, new = exact_eps_attend(
            q, k, v, state, feature_map=feature_map, eps=eps, causal=self.causal, xp=self.xp,
            to_host=self.to_host,
        )  # fmt: skip
        assert isinstance(out, _Dev)
        return out, new

    def take_moves(self) -> collections.Counter[str]:
        c = collections.Counter(d for d, _ in self.moves)
        self.moves.clear()
        return c


def _model(kind: str, seed: int = 0, dtype: Any = np.float64) -> EmbeddingModel:
    cfg = CONFIGS[kind]
    return EmbeddingModel(cfg, init_weights(cfg, seed), compute_dtype=dtype)


def _inputs(rng: np.random.Generator, model: EmbeddingModel, t: int) -> np.ndarray:
    c = model.config
    if c.input_kind == "tokens":
        assert c.vocab_size is not None
        return rng.integers(0, c.vocab_size, t)
    return rng.standard_normal((t, c.input_dim))


def _splits(rng: np.random.Generator, t: int) -> list[int]:
    k = min(t - 1, int(rng.integers(0, 6)))
    cuts = np.sort(rng.choice(np.arange(1, t), size=k, replace=False)) if k else []
    return [0, *[int(c) for c in cuts], t]


def _assert_states_close(a, b, rtol, atol):
    assert len(a) == len(b)
    for s1, s2 in zip(a, b, strict=True):
        np.testing.assert_allclose(s1.S, s2.S, rtol=rtol, atol=atol)
        np.testing.assert_allclose(s1.z, s2.z, rtol=rtol, atol=atol)


# -- the shared forward with xp = numpy ------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_forward_chunk_with_numpy_is_the_host_runtime(kind):
    m = _model(kind, dtype=np.float32)
    rng = np.random.default_rng(3)
    x = _inputs(rng, m, 21)
    st = m.initial_states()
    attend = lambda q, k, v, s, rule: causal_linear_attention(  # noqa: E731
        q, k, v, s, feature_map=m.feature_map, eps=m.config.eps, backend="numpy"
    )
    xin = x if m.config.input_kind == "tokens" else x.astype(np.float32)
    emb, new = _forward_chunk(np, m._host, xin, st, config=m.config, attend=attend)
    ref, ref_states = m.embed_chunk(x, st, backend="numpy")
    np.testing.assert_array_equal(emb, ref)
    _assert_states_close(new, ref_states, 0, 0)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(sorted(CONFIGS)),
    dtype=st.sampled_from(["float64", "float32"]),
    chunk=st.sampled_from([1, 3, 64]),
)
def test_device_path_with_numpy_equals_the_host_path(seed, kind, dtype, chunk):
    """Random chunk splits through `_embed_chunk_on` (xp=numpy, the CuPy scan algorithm) vs
    the host runtime (backend numpy) on the whole sequence."""
    rng = np.random.default_rng(seed)
    m = _model(kind, int(rng.integers(1000)), np.dtype(dtype))
    t = int(rng.integers(1, 60))
    x = _inputs(rng, m, t)
    whole, whole_states = m.embed_chunk(x, None, backend="numpy")
    dev = _NumpyDevice(chunk)
    states = m.initial_states()
    parts = []
    for a, b in itertools.pairwise(_splits(rng, t)):
        e, states = m._embed_chunk_on(dev, m._prepare_inputs(x[a:b]), states)
        assert e.dtype == whole.dtype
        parts.append(e)
    tol = 1e-10 if dtype == "float64" else 2e-4
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=tol, atol=tol)
    _assert_states_close(states, whole_states, tol, tol)
    assert all(s.S.dtype == np.float64 for s in states)


# -- the stand-in device: nothing crosses but what should ------------------------------------
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_stand_in_device_moves_only_inputs_embeddings_and_states(kind):
    m = _model(kind, seed=5, dtype=np.float32)
    n_layers = m.config.n_layers
    dev = _StandInDevice(chunk_size=4)
    rng = np.random.default_rng(11)
    x = _inputs(rng, m, 30)
    ref, ref_states = m.embed_chunk(x, None, backend="numpy")

    # host states in -> host states out; first call uploads the weights too
    _Dev.ufuncs.clear()
    e1, s1 = m._embed_chunk_on(dev, m._prepare_inputs(x[:13]), m.initial_states())
    first = dev.take_moves()
    n_weights = sum(1 for _ in _iter_arrays(m._host))
    assert first == {"up": n_weights + 2, "down": 2}, first  # + inputs, packed states
    assert type(e1) is np.ndarray and all(type(s.S) is np.ndarray for s in s1)
    # every projection ran on device arrays: 4 per layer (qkv, o, up, down) + feature input
    n_matmul_model = 4 * n_layers + (m.config.input_kind == "features")
    assert _Dev.ufuncs["matmul.__call__"] >= n_matmul_model
    assert dev.xp.calls["einsum"] == 2 * n_layers + 1  # the norms, through xp

    # device states in -> device states out, no state copies; weights not uploaded again
    dst = [AttentionState(*(a.view(_Dev).copy() for a in s)) for s in s1]
    e2, s2 = m._embed_chunk_on(dev, m._prepare_inputs(x[13:]), dst)
    assert dev.take_moves() == {"up": 1, "down": 1}  # the inputs and the embeddings
    assert all(isinstance(s.S, _Dev) and isinstance(s.z, _Dev) for s in s2)
    assert len(m._device_weights) == 1

    np.testing.assert_allclose(np.concatenate([e1, e2]), ref, rtol=2e-4, atol=2e-4)
    host = [AttentionState(s.S.view(np.ndarray), s.z.view(np.ndarray)) for s in s2]
    _assert_states_close(host, ref_states, 1e-4, 1e-4)


def _iter_arrays(w: Any):
    for a in (w.embed, w.w_in, w.b_in, *w.final):
        if a is not None:
            yield a
    for layer in w.layers:
        for a in (layer.w_qkv, layer.w_o, layer.w_up, layer.b_up, layer.w_down, layer.b_down):
            if a is not None:
                yield a
        for a in (*layer.n1, *layer.n2):
            if a is not None:
                yield a


def test_stand_in_device_catches_a_host_array_in_the_forward():
    """The check can fail: a weight left on the host raises, as it would with CuPy."""
    m = _model("tokens", dtype=np.float32)
    dev = _StandInDevice()
    w = m._weights_on(dev)
    w.layers[1].w_o = w.layers[1].w_o.view(np.ndarray)  # as if never uploaded
    with pytest.raises(TypeError, match="host ndarray"):
        m._embed_chunk_on(dev, m._prepare_inputs(np.arange(5)), None)
    with pytest.raises(HostReadError):
        float(np.ones(1).view(_Dev))


def test_stand_in_device_refuses_mixed_states():
    m = _model("tokens", dtype=np.float32)
    st = m.initial_states()
    st[1] = AttentionState(st[1].S.view(_Dev), st[1].z.view(_Dev))
    with pytest.raises(TypeError, match="mix host and device"):
        m._embed_chunk_on(_StandInDevice(), m._prepare_inputs(np.arange(3)), st)


def test_builtin_model_on_the_stand_in_device():
    m = load_model("builtin:default")
    rng = np.random.default_rng(2)
    x = rng.integers(0, m.config.vocab_size, 200)
    ref = m.embed(x, backend="numpy")
    dev = _StandInDevice()
    states: Any = m.initial_states()
    parts = []
    for a, b in itertools.pairwise([0, 1, 64, 65, 200]):
        e, states = m._embed_chunk_on(dev, m._prepare_inputs(x[a:b]), states)
        parts.append(e)
    np.testing.assert_allclose(np.concatenate(parts), ref, rtol=1e-4, atol=1e-4)


# -- FAVOR+'s eps on the device path (never run on a GPU here: through the stand-ins) -----------
# d_head = 128 with 128 features: the key shift b = max(0, B - 60) is about 24, so a scalar eps
# in the rescaled domain would be e^24 times too large (the device path before the fix).
FAVOR_BIG = ModelConfig(
    input_kind="features", vocab_size=None, input_dim=3, d_model=8, n_layers=2, n_heads=1,
    d_head=128, d_ff=12, feature_map={"name": "favor+", "num_features": 128, "seed": 0}, eps=1e-3,
)  # fmt: skip


class _ScalarEpsDevice(_NumpyDevice):
    """The device path as it was: eps passed to the kernel as one scalar."""

    def attend(self, q, k, v, state, *, feature_map, eps):
        return self.causal(q, k, v, state, feature_map=feature_map, eps=eps, dtype=q.dtype)


@pytest.mark.parametrize("k_scale", [1.0, 5.0], ids=["keys", "far-keys"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("device", ["numpy", "stand-in"])
def test_device_path_applies_favor_eps_in_the_unscaled_domain(device, dtype, k_scale):
    """far-keys: layer 0's keys ×5 and eps = 0, so that every key's features underflow float32
    while the ratio num/den stays O(1): the chunk must run in float64, as on the host."""
    from linstream.ops import get_feature_map

    assert get_feature_map(FAVOR_BIG.feature_map).key_shift(128) > 20
    cfg = FAVOR_BIG if k_scale == 1 else dataclasses.replace(FAVOR_BIG, eps=0.0)
    w = init_weights(cfg, 3)
    w["layers.0.attn.k.weight"] = w["layers.0.attn.k.weight"] * np.float32(k_scale)
    m = EmbeddingModel(cfg, w, compute_dtype=np.dtype(dtype))
    x = np.random.default_rng(4).standard_normal((40, 3)) * 2
    ref, ref_states = m.embed_chunk(x, None, backend="numpy")  # the host path, fixed before
    dev = _NumpyDevice(chunk_size=8) if device == "numpy" else _StandInDevice(chunk_size=8)
    states: Any = m.initial_states()
    parts = []
    for a, b in itertools.pairwise([0, 1, 17, 40]):
        e, states = m._embed_chunk_on(dev, m._prepare_inputs(x[a:b]), states)
        parts.append(e)
    tol = 1e-10 if dtype == "float64" else 2e-4
    np.testing.assert_allclose(np.concatenate(parts), ref, rtol=tol, atol=tol)
    _assert_states_close(states, ref_states, tol, tol)
    if cfg.eps > 0:  # what the test would see without the fix
        old, _ = m._embed_chunk_on(_ScalarEpsDevice(8), m._prepare_inputs(x), None)
        assert np.max(np.abs(old - ref)) > 1000 * tol


# -- the real device class with the CUDA kernels on the CPU emulator -----------------------------
def _emulated_device(schedule: int = 1) -> _CupyDevice:
    """`_CupyDevice` as backend="cupy" builds it, its launcher the CPU emulator's: the CUDA
    kernels' own source runs (tests/helpers/cuda_emu.py), on NumPy arrays."""
    if compiler_missing() is not None:
        pytest.skip(str(compiler_missing()))
    return _CupyDevice(launcher=EmuLauncher(schedule=schedule))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(sorted(CONFIGS)))
def test_device_path_with_the_cuda_kernels_equals_the_host_path(seed, kind):
    """Random chunk splits through `_embed_chunk_on` with `_CupyDevice` (its attention the CUDA
    kernels, emulated) vs the host runtime on the whole sequence; float32 as on a GPU."""
    rng = np.random.default_rng(seed)
    m = _model(kind, int(rng.integers(1000)), np.dtype(np.float32))
    t = int(rng.integers(1, 60))
    x = _inputs(rng, m, t)
    whole, whole_states = m.embed_chunk(x, None, backend="numpy")
    dev = _emulated_device()
    states = m.initial_states()
    parts = []
    for a, b in itertools.pairwise(_splits(rng, t)):
        e, states = m._embed_chunk_on(dev, m._prepare_inputs(x[a:b]), states)
        parts.append(e)
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=2e-4, atol=2e-4)
    _assert_states_close(states, whole_states, 2e-4, 2e-4)


def test_builtin_model_with_the_cuda_kernels():
    m = load_model("builtin:default")
    x = np.random.default_rng(2).integers(0, m.config.vocab_size, 150)
    ref = m.embed(x, backend="numpy")
    dev = _emulated_device()
    states: Any = m.initial_states()
    parts = []
    for a, b in itertools.pairwise([0, 1, 64, 65, 150]):
        e, states = m._embed_chunk_on(dev, m._prepare_inputs(x[a:b]), states)
        parts.append(e)
    np.testing.assert_allclose(np.concatenate(parts), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_favor_eps_with_the_cuda_kernels(dtype):
    """FAVOR+ on the device path, far keys and eps = 0 (float32 chunks fall back to float64)."""
    cfg = dataclasses.replace(FAVOR_BIG, eps=0.0)
    w = init_weights(cfg, 3)
    w["layers.0.attn.k.weight"] = w["layers.0.attn.k.weight"] * np.float32(5.0)
    m = EmbeddingModel(cfg, w, compute_dtype=np.dtype(dtype))
    x = np.random.default_rng(4).standard_normal((40, 3)) * 2
    ref, ref_states = m.embed_chunk(x, None, backend="numpy")
    dev = _emulated_device()
    states: Any = m.initial_states()
    parts = []
    for a, b in itertools.pairwise([0, 1, 17, 40]):
        e, states = m._embed_chunk_on(dev, m._prepare_inputs(x[a:b]), states)
        parts.append(e)
    tol = 1e-10 if dtype == "float64" else 2e-4
    np.testing.assert_allclose(np.concatenate(parts), ref, rtol=tol, atol=tol)
    _assert_states_close(states, ref_states, tol, tol)


# -- the public surface on a machine without a device ----------------------------------------
@pytest.mark.skipif(cupy_available(), reason="checks the no-device behaviour")
def test_cupy_without_a_device_says_why():
    from linstream.ops.backend import BackendUnavailableError

    m = _model("tokens", dtype=np.float32)
    with pytest.raises(BackendUnavailableError, match="cupy"):
        m.embed_chunk(np.arange(3), None, backend="cupy")
    with pytest.raises(BackendUnavailableError, match="cupy"):
        m.to_device_states(m.initial_states())
    host = m.initial_states()
    assert m.to_host_states(host) == host  # host states: returned as they are


def test_host_backends_refuse_device_states(monkeypatch):
    """A CuPy state given to a host backend is a TypeError naming the fix (a fake CuPy type,
    recognised by module name as the runtime does)."""
    fake = type("ndarray", (np.ndarray,), {"__module__": "cupy._core.core"})
    m = _model("tokens", dtype=np.float32)
    st = m.initial_states()
    st[0] = AttentionState(st[0].S.view(fake), st[0].z.view(fake))
    with pytest.raises(TypeError, match="to_host_states"):
        m.embed_chunk(np.arange(3), st, backend="numpy")


def test_pickled_model_drops_device_copies():
    import pickle

    m = _model("tokens", dtype=np.float32)
    m._weights_on(_StandInDevice())
    assert len(m._device_weights) == 1
    m2 = pickle.loads(pickle.dumps(m))  # Beam ships DoFns holding a model this way
    assert m2._device_weights == {}
    x = np.arange(7)
    np.testing.assert_array_equal(
        m2.embed_chunk(x, None, backend="numpy")[0], m.embed_chunk(x, None, backend="numpy")[0]
    )
