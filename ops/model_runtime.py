"""The embedding model's streaming runtime: one chunk at a time, carried per-layer state, no torch.

    model = load_model("builtin:default")            # or a path to a .safetensors model file
    states = model.initial_states()                  # L × AttentionState, float64 zeros
    emb, states = model.embed_chunk(tokens, states)  # emb [T, d_model] float32

Embedding a sequence chunk by chunk gives the same embeddings as embedding it in one piece, for
any split (the attention state carries everything the past contributes; every other step is per
token).  Projections and the feed-forward block are NumPy matrix products (BLAS, float32);
attention is `causal_linear_attention` with the model's feature map and eps, its state float64
unless the given states are float32.  `compute_dtype=np.float64` runs everything in float64
(tests compare that mode with the PyTorch twin to ~1e-12).
"""

from __future__ import annotations

import importlib.resources
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .attention import causal_linear_attention
from .attention_state import AttentionState
from .feature_maps import get_feature_map
from .model_config import ModelConfig
from .model_weights import check_tensors, fingerprint, read_model

__all__ = ["BUILTIN_PREFIX", "EmbeddingModel", "builtin_models", "load_model"]

BUILTIN_PREFIX = "builtin:"
_BUILTIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


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
) -> EmbeddingModel:
    """Load a model: "builtin:NAME" (shipped in the package), a path to a .safetensors model
    file, or the file's bytes (for files read from object stores by the caller).

    The file is untrusted: a missing or unexpected tensor, a wrong shape or dtype, NaN/Inf
    weights or an invalid config raise `ModelFileError` (a ValueError) naming the tensor.
    """
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
        config, weights = read_model(source)
        label = os.fspath(source)
    return EmbeddingModel(config, weights, compute_dtype=compute_dtype, source=label, checked=True)


class _Layer:
    """One block's weights, laid out for x @ W products (transposed once at load)."""

    def __init__(self, w: Mapping[str, np.ndarray], p: str, dt: np.dtype, layernorm: bool) -> None:
        def t(name: str) -> np.ndarray:
            return np.ascontiguousarray(w[f"{p}.{name}"].T, dtype=dt)

        def v(name: str) -> np.ndarray | None:
            key = f"{p}.{name}"
            return np.asarray(w[key], dtype=dt) if key in w else None

        # q, k and v in one product: [d_model, 3·d_attn].
        self.w_qkv = np.ascontiguousarray(
            np.concatenate([t("attn.q.weight"), t("attn.k.weight"), t("attn.v.weight")], axis=1)
        )
        self.w_o = t("attn.o.weight")
        self.w_up = t("ff.up.weight")
        self.b_up = v("ff.up.bias")
        self.w_down = t("ff.down.weight")
        self.b_down = v("ff.down.bias")
        self.n1 = (v("norm1.weight"), v("norm1.bias") if layernorm else None)
        self.n2 = (v("norm2.weight"), v("norm2.bias") if layernorm else None)


class EmbeddingModel:
    """A loaded model that embeds one chunk at a time (see the module docstring).

    config: ModelConfig; fingerprint: hex sha256 over config, weights and feature-map params
    (checkpoints record it); state_shape: (L, H, F, d_head), each layer's state being
    S [H, F, d_head] and z [H, F]; weights: the stored float32 tensors (read-only views).
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
        layernorm = config.normalization == "layernorm"
        if config.input_kind == "tokens":
            self._embed: np.ndarray | None = np.asarray(stored["embed.weight"], dtype=dt)
            self._w_in = self._b_in = None
        else:
            self._embed = None
            self._w_in = np.ascontiguousarray(stored["input_proj.weight"].T, dtype=dt)
            self._b_in = np.asarray(stored["input_proj.bias"], dtype=dt)
        self._layers = [
            _Layer(stored, f"layers.{i}", dt, layernorm) for i in range(config.n_layers)
        ]
        self._final = (
            np.asarray(stored["final_norm.weight"], dtype=dt),
            np.asarray(stored["final_norm.bias"], dtype=dt) if layernorm else None,
        )

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
            out.append(st)
        return out

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
            if x.dtype.kind not in "iu":
                msg = (
                    f"token ids must be an integer array (e.g. int32 or int64), got dtype {x.dtype}"
                )
                raise TypeError(msg)
            if x.ndim != 1:
                msg = f"token ids must be 1-D [T], got shape {x.shape}"
                raise ValueError(msg)
            if x.shape[0] == 0:
                msg = "empty chunk: token ids must hold at least one token, got shape (0,)"
                raise ValueError(msg)
            assert c.vocab_size is not None
            bad = np.flatnonzero((x < 0) | (x >= c.vocab_size))
            if bad.size:
                pos = int(bad[0])
                msg = (
                    f"unknown token id {int(x[pos])} at position {pos}: the model's vocabulary "
                    f"has {c.vocab_size} ids (0 to {c.vocab_size - 1})"
                    + (f"; {bad.size} ids out of range in all" if bad.size > 1 else "")
                )
                raise ValueError(msg)
            return x
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
    def _norm(self, x: np.ndarray, wb: tuple[np.ndarray | None, np.ndarray | None]) -> np.ndarray:
        w, b = wb
        eps = self.config.norm_eps
        if b is not None:  # layernorm: (x - mean) / sqrt(var + eps) · w + b
            y = x - x.mean(axis=1, keepdims=True)
            var = np.einsum("td,td->t", y, y) / x.shape[1]
        else:  # rmsnorm: x / sqrt(mean(x²) + eps) · w
            y = x.copy()
            var = np.einsum("td,td->t", x, x) / x.shape[1]
        y *= (1.0 / np.sqrt(var + eps))[:, None].astype(x.dtype, copy=False)
        y *= w
        if b is not None:
            y += b
        return y

    def _activation(self, u: np.ndarray) -> np.ndarray:
        """In place on u (a fresh buffer)."""
        act = self.config.activation
        if act == "relu":
            return np.maximum(u, 0, out=u)
        if act == "silu":  # x · sigmoid(x), sigmoid(x) = (1 + tanh(x/2)) / 2 (no overflow)
            s = np.tanh(u * 0.5)
            s += 1.0
            s *= 0.5
            u *= s
            return u
        # gelu_tanh: x/2 · (1 + tanh(sqrt(2/π) · (x + 0.044715 x³)))
        s = u * u
        s *= 0.044715
        s += 1.0
        s *= u
        s *= _SQRT_2_OVER_PI
        np.tanh(s, out=s)
        s += 1.0
        u *= 0.5
        u *= s
        return u

    def embed_chunk(
        self, inputs: Any, states: Sequence[AttentionState] | None, *, backend: str = "auto"
    ) -> tuple[np.ndarray, list[AttentionState]]:
        """Embed one chunk, continuing from `states` (None: the start of a sequence).

        inputs: int [T] token ids, or float [T, input_dim] feature vectors.  Returns
        (emb [T, d_model] in compute_dtype (float32 by default), new states), one
        AttentionState per layer in the given states' dtype.  Neither inputs nor states are
        modified.  Raises TypeError / ValueError as `check_inputs` describes.
        """
        x_in = self._prepare_inputs(inputs)
        st = self.initial_states() if states is None else self._check_states(states)
        c = self.config
        dt = self.compute_dtype
        if self._embed is not None:
            x = self._embed[x_in]
        else:
            assert self._w_in is not None and self._b_in is not None
            x = x_in.astype(dt, copy=False) @ self._w_in
            x += self._b_in
        t = x.shape[0]
        h, dh, a = c.n_heads, c.d_head, c.d_attn
        new_states = []
        for layer, s in zip(self._layers, st, strict=True):
            qkv = self._norm(x, layer.n1) @ layer.w_qkv  # [T, 3·d_attn]
            qkv = qkv.reshape(t, 3, h, dh)
            y, s_new = causal_linear_attention(
                qkv[:, 0],
                qkv[:, 1],
                qkv[:, 2],
                s,
                feature_map=self.feature_map,
                eps=c.eps,
                backend=backend,
            )
            new_states.append(s_new)
            x += y.reshape(t, a) @ layer.w_o
            u = self._norm(x, layer.n2) @ layer.w_up
            if layer.b_up is not None:
                u += layer.b_up
            x += self._activation(u) @ layer.w_down
            if layer.b_down is not None:
                x += layer.b_down
        return self._norm(x, self._final), new_states

    def embed(
        self, inputs: Any, *, chunk_size: int | None = None, backend: str = "auto"
    ) -> np.ndarray:
        """Embed a whole sequence from the zero state (in chunks of `chunk_size` if given)."""
        x = np.asarray(inputs)
        n = x.shape[0] if x.ndim else 0
        step = n if not chunk_size else int(chunk_size)
        states: list[AttentionState] | None = None
        parts = []
        for s in range(0, max(n, 1), max(step, 1)):
            e, states = self.embed_chunk(x[s : s + step], states, backend=backend)
            parts.append(e)
        return np.concatenate(parts, axis=0)
