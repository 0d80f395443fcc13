"""The embedding model's streaming runtime: one chunk at a time, carried per-layer state, no torch.

    model = load_model("builtin:default")            # or a path to a .safetensors model file
                                                     # (a checkpoint folder in fla's format loads
                                                     # as `linstream.ops.model.fla.FlaModel`)
    states = model.initial_states()                  # L × AttentionState, float64 zeros
    emb, states = model.embed_chunk(tokens, states)  # emb [T, d_model] float32

Embedding a sequence chunk by chunk gives the same embeddings as embedding it in one piece, for
any split (the attention state carries everything the past contributes; every other step is per
token).  Projections and the feed-forward block are NumPy matrix products (BLAS, float32);
attention is `causal_linear_attention` with the model's feature map and eps, its state float64
unless the given states are float32.  `compute_dtype=np.float64` runs everything in float64
(tests compare that mode with the PyTorch twin to ~1e-12).  On the default numba backend in
float32 the steps between the products are fused Numba passes (`model_kernels`), a token
model's first projection is a lookup per token id (`_Weights.with_qkv0`), BLAS runs on one
thread, and chunks of 256 tokens or more split their rows into ranges fixed by the chunk's
length, run on the process's threads (`model_threads`; on every host path, so the bits do not
depend on the thread count).

One forward for every device: `model_layers.forward_chunk` (the layers, their update rules and
fused projections) is written against an array namespace `xp`.  On the host (backend "numpy"
or "numba") it runs with `xp=numpy` and `causal_linear_attention`.  With backend "cupy" (or
"auto" on a machine with a usable CUDA device) it runs with `xp=cupy`: the weights are uploaded
once per model and device (cached), the chunk's inputs are uploaded,
norms, projections (cuBLAS), activations and attention (`cupy_causal` on device arrays, states
as device arrays) stay on the device across layers, and only the embeddings come back.  States
follow the caller:

    host states in  -> host states out (one packed device->host copy per chunk; Beam state and
                       checkpoints hold bytes, so they need host arrays)
    device states in -> device states out (no copy; `model.to_host_states(states)` before a
                       checkpoint, `model.to_device_states(states)` to start on the device)

(About 500 lines: the loader and the model class with its per-chunk forward, kept together so that
the forward reads top to bottom; layers, fused passes and threads have their own modules.)
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import re
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from linstream.ops.attention import causal_linear_attention
from linstream.ops.attention_state import AttentionState
from linstream.ops.backend import resolve_backend
from linstream.ops.feature_maps import get_feature_map
from linstream.ops.rules.exact_eps import needs_exact_eps

from . import layers as model_layers
from .blas import _thread_layout
from .config import ModelConfig
from .device import (
    _cupy_device,
    _Device,
    _download_states,
    _on_cupy,
    _states_on_device,
    _upload_states,
)
from .layers import (
    _activation as _activation,  # re-exported (tests/ops/additive/test_numba_kernel.py)
)
from .layers import _Weights
from .protocol import StateLayout, check_token_ids
from .weights import check_tensors, fingerprint, read_model

if TYPE_CHECKING:
    from .fla import FlaModel

__all__ = ["BUILTIN_PREFIX", "EmbeddingModel", "builtin_models", "load_model"]

BUILTIN_PREFIX = "builtin:"
_BUILTIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_log = logging.getLogger(__name__)
_DEVICE_LOCK = threading.Lock()  # guards the per-model device weight caches (uploads)


def _builtin_dir() -> Any:
    return importlib.resources.files(__package__ or "linstream.ops").joinpath("builtin")


def builtin_models() -> list[str]:
    """Names of the models shipped in the package (use as `load_model("builtin:NAME")`)."""
    d = _builtin_dir()
    return sorted(
        p.name.removesuffix(".safetensors") for p in d.iterdir() if p.name.endswith(".safetensors")
    )


def load_model(
    source: str | os.PathLike[str] | bytes, *, compute_dtype: npt.DTypeLike = np.float32
) -> EmbeddingModel | FlaModel:
    """Load a model: "builtin:NAME" (shipped in the package), a path to a .safetensors model
    file, the file's bytes (for files read from object stores by the caller), or a checkpoint
    folder in fla's format (a local folder or its URL; `linstream.ops.model.fla.load_model`).

    The file is untrusted: a missing or unexpected tensor, a wrong shape or dtype, NaN/Inf
    weights or an invalid config raise `ModelFileError` (a ValueError) naming the tensor
    (`ModelFolderError`, also a ValueError, for a folder).
    """
    if not isinstance(source, bytes | bytearray | memoryview) and is_model_folder(source):
        from .fla import load_model as load_folder

        return load_folder(source, compute_dtype=compute_dtype)
    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        name = source.removeprefix(BUILTIN_PREFIX)
        available = builtin_models()
        if not _BUILTIN_NAME.match(name) or name not in available:
            msg = f"unknown built-in model {name!r}; available: {available}"
            raise ValueError(msg)
        data = _builtin_dir().joinpath(f"{name}.safetensors").read_bytes()
        config, weights = read_model(data, name=source)
        label = source
    elif isinstance(source, (bytes, bytearray, memoryview)):
        config, weights = read_model(bytes(source))
        label = "<model bytes>"
    else:
        path = os.fspath(source)
        if "://" not in path and not os.path.exists(path):
            msg = (
                "expected builtin:NAME, a .safetensors model file or a checkpoint folder, "
                f"got {path!r}, which does not exist"
            )
            raise FileNotFoundError(msg)
        config, weights = read_model(source)
        label = path
    return EmbeddingModel(config, weights, compute_dtype=compute_dtype, source=label, checked=True)


def is_model_folder(source: str | os.PathLike[str]) -> bool:
    """Whether ``source`` is a folder (a local one, or a URL fsspec lists as a directory or
    that ends with "/"), which `load_model` reads as a checkpoint folder in fla's format."""
    path = os.fspath(source)
    if path.startswith(BUILTIN_PREFIX):
        return False
    if "://" not in path or path.startswith("file://"):
        return os.path.isdir(path.removeprefix("file://"))
    if path.endswith("/"):
        return True
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    try:
        return bool(fs.isdir(root))
    except OSError:
        return False


class EmbeddingModel:
    """A loaded model that embeds one chunk at a time (see the module docstring).

    config: ModelConfig; fingerprint: hex sha256 over config, weights and feature-map params
    (checkpoints record it); state_shape: (L, H, F, d_head), each layer's state being
    S [H, F, d_head] and z [H, F]; weights: the stored float32 tensors (read-only views).
    States may be host (NumPy) or, with backend "cupy", device (CuPy) arrays: `embed_chunk`
    returns them where they came from; `to_host_states` / `to_device_states` convert.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, np.ndarray],
        *,
        compute_dtype: npt.DTypeLike = np.float32,
        source: str = "<memory>",
        checked: bool = False,
    ) -> None:
        if not checked:
            check_tensors(config, weights, source=source)
        dt = np.dtype(compute_dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            msg = f"compute_dtype must be float32 or float64, got {dt}"
            raise TypeError(msg)
        self.config = config
        self.source = source
        self.compute_dtype = dt
        stored = {}
        for name, arr in weights.items():
            a = np.array(arr, copy=True)
            a.setflags(write=False)
            stored[name] = a
        self.weights: Mapping[str, np.ndarray] = stored
        self.fingerprint: str = fingerprint(config, stored)
        self.feature_map = get_feature_map(config.feature_map)
        f = int(self.feature_map.out_dim(config.d_head))
        self.state_shape: tuple[int, int, int, int] = (
            config.n_layers,
            config.n_heads,
            f,
            config.d_head,
        )
        self._host = _Weights.build(config, stored, dt)
        # additive layers call the Numba kernel directly, past causal_linear_attention's checks
        # (the model's shapes are right by construction; the states are checked per call),
        # unless the feature map needs the exact-eps path (FAVOR+)
        self._numba_direct = not needs_exact_eps(self.feature_map, config.d_head)
        # layers whose rule has no device (CuPy) kernel: the forward then runs on the host
        self.rule_layers = [i for i, ly in enumerate(self._host.layers) if not ly.rule.additive]
        self._said_host = False  # "auto" chose a GPU but the rule layers keep the model here
        # The weights uploaded to each device (by _Device.cache_key), on first use there.
        self._device_weights: dict[Hashable, _Weights] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_device_weights"] = {}  # device copies are not shipped; re-uploaded on use
        state["_host"] = self._host.without_qkv0()  # derived: formed again on arrival
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._host = self._host.with_qkv0(self.config)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"EmbeddingModel({self.source!r}, input={c.input_kind}, d_model={c.d_model}, "
            f"layers={c.n_layers}, heads={c.n_heads}x{c.d_head}, "
            f"feature_map={c.feature_map['name']}, fingerprint={self.fingerprint[:12]})"
        )

    def with_compute_dtype(self, compute_dtype: npt.DTypeLike) -> EmbeddingModel:
        """The same model (same fingerprint) computing in another dtype."""
        return EmbeddingModel(
            self.config, self.weights, compute_dtype=compute_dtype, source=self.source, checked=True
        )

    # -- state ------------------------------------------------------------------------------
    def initial_states(self, dtype: npt.DTypeLike = np.float64) -> list[AttentionState]:
        """Zero state for every layer: L × AttentionState(S [H, F, d_head], z [H, F])."""
        dt = np.dtype(dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            msg = f"state dtype must be float32 or float64, got {dt}"
            raise TypeError(msg)
        n_layers, h, f, dv = self.state_shape
        return [AttentionState.zeros(h, f, dv, dt) for _ in range(n_layers)]

    def state_layout(self) -> StateLayout:
        """The carried state as a checkpoint stores it: S [L, H, F, d_head], z [L, H, F]."""
        n_layers, h, f, dv = self.state_shape
        return (("S", (n_layers, h, f, dv)), ("z", (n_layers, h, f)))

    def stack_states(
        self, states: Sequence[AttentionState], position: int
    ) -> dict[str, np.ndarray]:
        """The per-layer states as S and z with the layers first (``position``: the protocol's;
        these states do not depend on it)."""
        st = self._check_states(states)
        return {"S": np.stack([s.S for s in st]), "z": np.stack([s.z for s in st])}

    def unstack_states(
        self, arrays: Mapping[str, np.ndarray], position: int
    ) -> list[AttentionState]:
        """Per-layer states (views of ``arrays``): the inverse of `stack_states`."""
        layout = dict(self.state_layout())
        shapes = {n: tuple(a.shape) for n, a in arrays.items()}
        if shapes != layout:
            msg = f"a state of {shapes} does not fit the model, which carries {layout}"
            raise ValueError(msg)
        S, z = arrays["S"], arrays["z"]
        return [AttentionState(S[i], z[i]) for i in range(len(S))]

    def _check_states(self, states: Any) -> list[AttentionState]:
        n_layers, h, f, dv = self.state_shape
        if isinstance(states, AttentionState) or not isinstance(states, Sequence):
            msg = (
                f"states must be a list of {n_layers} AttentionState (one per layer, from "
                f"initial_states() or the previous embed_chunk), got {type(states).__name__}"
            )
            raise TypeError(msg)
        if len(states) != n_layers:
            msg = f"states must hold one AttentionState per layer ({n_layers}), got {len(states)}"
            raise ValueError(msg)
        out = []
        for i, st in enumerate(states):
            if not isinstance(st, AttentionState):
                msg = f"states[{i}] must be an AttentionState, got {type(st).__name__}"
                raise TypeError(msg)
            if tuple(st.S.shape) != (h, f, dv) or tuple(st.z.shape) != (h, f):
                msg = (
                    f"states[{i}] has S {tuple(st.S.shape)} and z {tuple(st.z.shape)}, expected "
                    f"S {(h, f, dv)} and z {(h, f)} (model state_shape {self.state_shape})"
                )
                raise ValueError(msg)
            for nm, a in (("S", st.S), ("z", st.z)):
                if np.dtype(a.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
                    msg = f"states[{i}].{nm} must be float32 or float64, got {a.dtype}"
                    raise TypeError(msg)
            if st.S.dtype != st.z.dtype:
                msg = f"states[{i}].S and .z must share a dtype, got {st.S.dtype} and {st.z.dtype}"
                raise TypeError(msg)
            out.append(st)
        return out

    def to_host_states(self, states: Sequence[AttentionState]) -> list[AttentionState]:
        """Host (NumPy) copies of per-layer states, e.g. device states before a checkpoint or
        before Beam state (both hold bytes).  Device (CuPy) states come over in one packed
        device->host copy; host states are returned as they are (not copied)."""
        st = self._check_states(states)
        if not any(_on_cupy(a) for s in st for a in (s.S, s.z)):
            return st
        dev = _cupy_device()
        _states_on_device(st, dev)  # a host/device mix is a TypeError
        return _download_states(st, dev)

    def to_device_states(self, states: Sequence[AttentionState]) -> list[AttentionState]:
        """Per-layer states on the current CuPy device (one packed host->device copy), so that
        `embed_chunk(..., backend="cupy")` keeps them there across chunks.  Device states are
        returned as they are.  BackendUnavailableError without a usable CUDA device."""
        st = self._check_states(states)
        dev = _cupy_device()
        return st if _states_on_device(st, dev) else _upload_states(st, dev)

    # -- inputs -----------------------------------------------------------------------------
    def check_inputs(self, inputs: Any) -> None:
        """Raise what `embed_chunk` would raise for these inputs, without computing.

        tokens: a 1-D integer array [T] of ids in [0, vocab_size); features: a 2-D floating
        array [T, input_dim] of finite values.  T must be at least 1.  TypeError for a wrong
        dtype, ValueError for a wrong shape, an unknown token id, or NaN/Inf.
        """
        self._prepare_inputs(inputs)

    def _prepare_inputs(self, inputs: Any) -> np.ndarray:
        c = self.config
        if not hasattr(inputs, "dtype") or not hasattr(inputs, "shape"):
            msg = f"inputs must be a NumPy array, got {type(inputs).__name__}"
            raise TypeError(msg)
        x = np.asarray(inputs)
        if c.input_kind == "tokens":
            assert c.vocab_size is not None
            return check_token_ids(x, c.vocab_size)
        if x.dtype.kind != "f":
            msg = f"feature vectors must be a floating array (float32), got dtype {x.dtype}"
            raise TypeError(msg)
        if x.ndim != 2 or x.shape[1] != c.input_dim:
            msg = f"feature vectors must be [T, {c.input_dim}], got shape {x.shape}"
            raise ValueError(msg)
        if x.shape[0] == 0:
            msg = f"empty chunk: feature vectors must hold at least one row, got shape {x.shape}"
            raise ValueError(msg)
        finite = np.isfinite(x)
        if not finite.all():
            t, j = (int(i) for i in np.argwhere(~finite)[0])
            msg = f"feature vectors must be finite; found {x[t, j]} at row {t}, column {j}"
            raise ValueError(msg)
        return x

    # -- forward ----------------------------------------------------------------------------
    def embed_chunk(
        self, inputs: Any, states: Sequence[AttentionState] | None, *, backend: str = "auto"
    ) -> tuple[np.ndarray, list[AttentionState]]:
        """Embed one chunk, continuing from `states` (None: the start of a sequence).

        inputs: int [T] token ids, or float [T, input_dim] feature vectors.  Returns
        (emb [T, d_model] in compute_dtype (float32 by default), new states), one
        AttentionState per layer in the given states' dtype.  Neither inputs nor states are
        modified.  Raises TypeError / ValueError as `check_inputs` describes.

        backend: "numpy" / "numba" run on the host; "cupy" (and "auto" where a CUDA device is
        usable) runs the whole forward on the device.  The embeddings always come back as
        NumPy; the states come back where they were given: host states (or None) -> host
        states (one device->host copy of all layers per chunk), CuPy states -> CuPy states
        (no copy; call `to_host_states` before checkpointing them).

        Layers with a rule other than "additive" run on the Numba CPU kernels, the only ones
        the rules have: on the host backends they do so whatever the backend, "auto" picks the
        host for such a model, and "cupy" is refused (ValueError).
        """
        x_in = self._prepare_inputs(inputs)
        checked = None if states is None else self._check_states(states)
        name = self._resolve_backend(backend)
        if name == "cupy":
            return self._embed_chunk_on(_cupy_device(), x_in, checked)
        st = self.initial_states() if checked is None else checked
        for i, s in enumerate(st):
            if _on_cupy(s.S) or _on_cupy(s.z):
                msg = (
                    f"states[{i}] holds CuPy (device) arrays but backend {name!r} runs on the "
                    "host: pass backend='cupy', or model.to_host_states(states) first"
                )
                raise TypeError(msg)
        fm, eps = self.feature_map, self.config.eps
        if name == "numba" and self._numba_direct:
            from linstream.ops.additive.numba import DEFAULT_CHUNK_SIZE, numba_causal

        def attend(
            q: Any, k: Any, v: Any, s: AttentionState, rule: dict[str, Any]
        ) -> tuple[Any, AttentionState]:
            if not rule and name == "numba" and self._numba_direct:
                # what causal_linear_attention runs for these (model-shaped, checked) arguments
                return numba_causal(
                    q, k, v, s, feature_map=fm, eps=eps, chunk_size=DEFAULT_CHUNK_SIZE,
                    dtype=q.dtype,
                )  # fmt: skip
            # a rule layer runs on its Numba kernel (rule={} is the additive default)
            be = "numba" if rule else name
            return causal_linear_attention(q, k, v, s, feature_map=fm, eps=eps, backend=be, **rule)

        ops = None
        if name == "numba" and self.compute_dtype == np.float32:
            # fused Numba passes for the norms, residual adds and activation
            from .kernels import NumbaOps

            ops = NumbaOps(self.config.norm_eps)
        # BLAS at one thread, a long chunk's rows in ranges fixed by its length: the same bits
        # whatever the thread count (`blas._thread_layout`)
        blas, split = _thread_layout()
        with blas:
            return model_layers.forward_chunk(
                np, self._host, x_in, st, config=self.config, attend=attend, ops=ops,
                split=split,
            )  # fmt: skip

    def _resolve_backend(self, backend: str) -> str:
        """The backend name for this model: "auto" keeps a model with rule layers on the host."""
        if backend == "cupy" and self.rule_layers:
            self._refuse_device()
        name = resolve_backend(backend)
        if name == "cupy" and self.rule_layers:  # "auto" (or LINSTREAM_BACKEND=cupy)
            host = resolve_backend("numba", allow_fallback=True)
            if not self._said_host:  # once per model: every chunk comes here
                self._said_host = True
                i = self.rule_layers[0]
                _log.warning(
                    "model %s: layer %d uses rule %r, which has no CuPy kernel, so this model "
                    "runs on the CPU (backend %r) although a GPU is available",
                    self.source,
                    i,
                    self.config.layer_rule(i)["rule"],
                    host,
                )
            return host
        return name

    def _refuse_device(self) -> None:
        i = self.rule_layers[0]
        rule = self.config.layer_rule(i)["rule"]
        msg = (
            f"layer {i} of this model uses rule {rule!r}, which has no CuPy kernel: expected "
            "backend 'auto', 'numba' or 'numpy' (the rules run on the Numba CPU kernels), "
            "got 'cupy'"
        )
        raise ValueError(msg)

    def _weights_on(self, dev: _Device) -> _Weights:
        """The weights on dev, uploaded on first use there and cached with the model."""
        key = dev.cache_key()
        w = self._device_weights.get(key)
        if w is None:
            with _DEVICE_LOCK:
                w = self._device_weights.get(key)
                if w is None:
                    w = self._host.map(dev.to_device)
                    self._device_weights[key] = w
        return w

    def _embed_chunk_on(
        self, dev: _Device, x_in: np.ndarray, states: list[AttentionState] | None
    ) -> tuple[np.ndarray, list[AttentionState]]:
        """embed_chunk on a device, from checked inputs and states (None: zeros, host out).

        Uploads: the weights once (cached), the chunk's inputs, and the states if they are on
        the host.  Downloads: the embeddings, and the states if they came from the host.
        """
        if self.rule_layers:
            self._refuse_device()
        if states is None:
            n_layers, h, f, dv = self.state_shape
            xp = dev.xp
            zero = [
                AttentionState(xp.zeros((h, f, dv), np.float64), xp.zeros((h, f), np.float64))
                for _ in range(n_layers)
            ]
            st, host_states = zero, True
        else:
            host_states = not _states_on_device(states, dev)
            st = _upload_states(states, dev) if host_states else states
        w = self._weights_on(dev)
        if w.embed is None:  # features: cast on the host, so the upload is the compute dtype
            x_in = x_in.astype(w.dtype, copy=False)
        fm, eps = self.feature_map, self.config.eps

        def attend(
            q: Any, k: Any, v: Any, s: AttentionState, rule: dict[str, Any]
        ) -> tuple[Any, AttentionState]:
            assert not rule, "rule layers are refused on a device above"
            return dev.attend(q, k, v, s, feature_map=fm, eps=eps)

        emb, new = model_layers.forward_chunk(
            dev.xp, w, dev.to_device(x_in), st, config=self.config, attend=attend
        )
        out = dev.to_host(emb)
        return out, (_download_states(new, dev) if host_states else new)

    def embed(
        self, inputs: Any, *, chunk_size: int | None = None, backend: str = "auto"
    ) -> np.ndarray:
        """Embed a whole sequence from the zero state (in chunks of `chunk_size` if given).

        With backend "cupy" the states stay on the device between chunks."""
        x = np.asarray(inputs)
        n = x.shape[0] if x.ndim else 0
        step = n if not chunk_size else int(chunk_size)
        states: list[AttentionState] | None = None
        if n and self._resolve_backend(backend) == "cupy":
            states = self.to_device_states(self.initial_states())
        parts = []
        for s in range(0, max(n, 1), max(step, 1)):
            e, states = self.embed_chunk(x[s : s + step], states, backend=backend)
            parts.append(e)
        return np.concatenate(parts, axis=0)
