"""Per-chunk functions of the stateful stage: raw attention over q/k/v, or the embedding model.

A step checks one chunk's payload (`validate`, raising `BadInput` with a dead-letter reason),
makes a sequence's first state, and applies a chunk to a state.  `SequenceStage`
(sequence_stage.py) does the rest — ordering, state, checkpoints — the same way for every step.

The state a step carries is a `SequenceState`: S and z per layer for raw attention and the
built-in model; for a checkpoint folder in fla's format, the model's named arrays (S, the short
convolutions' tails) stacked over its layers, its position the sequence's (`carried` and
`advanced` convert between the two forms).

(About 520 lines: the two steps, raw attention and the embedding model, share the payload checks
and the state conversions above them.)
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from linstream.ops import AttentionState, causal_linear_attention, get_feature_map
from linstream.ops.model.protocol import StreamingModel, UnknownTokenError
from linstream.pipeline.values import Unencodable
from linstream.state import CheckpointError, ModelMismatchError, SequenceState

from .model_layer import checked_layer as _checked_layer
from .rule_spec import EXPECTED_VALUES, RuleSpec, describe_fingerprint

__all__ = ["BadInput", "ChunkStep", "EmbedStep", "RawAttentionStep"]

# Dead-letter reasons a step gives (the stateful stage adds bad_index, after_final,
# beyond_buffer, gap, restore_failed, compute_error).
BAD_DTYPE = "bad_dtype"
NON_FINITE = "non_finite"
BAD_PAYLOAD = "bad_payload"
BAD_SHAPE = "bad_shape"
EMPTY_CHUNK = "empty_chunk"
UNKNOWN_TOKEN = "unknown_token"
INVALID_INPUT = "invalid_input"


class BadInput(Exception):
    """A chunk that goes to the dead letters: `reason` is a short code, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ChunkStep:
    """What the stateful stage needs from a per-chunk function."""

    #: hex digest written into every checkpoint; a restore with another one is refused.
    fingerprint: str = ""
    #: where the carried state lives: "float64" (default) or "float32".
    state_dtype: np.dtype = np.dtype(np.float64)
    #: Whether `advanced` stacks the layers `apply` returns (`SequenceState.from_layers`) and
    #: `carried` unstacks them: the stage then continues from those layers as they are and
    #: stacks them only for a commit.
    stacks_layers: bool = True

    def setup(self) -> None:
        """Load heavy things (model weights, compiled kernels) once per worker."""

    def validate(self, data: Any) -> Any:
        """Return the payload in the form `apply` takes, or raise BadInput."""
        raise NotImplementedError

    def state_shape(self, data: Any) -> tuple[int, int, int, int]:
        """(L, H, F, d_v) of the state a sequence starting with this (valid) payload carries
        (S's shape; a restore refuses a commit of another)."""
        raise NotImplementedError

    def initial_state(self, seq_id: str, data: Any) -> SequenceState:
        """The zero state of a sequence starting with this (valid) payload."""
        return SequenceState.initial(
            seq_id, self.state_shape(data), self.fingerprint, dtype=self.state_dtype
        )

    def carried(self, st: SequenceState) -> list[Any]:
        """What `apply` continues from: ``st``'s per-layer states (ValueError if ``st`` cannot
        be continued by this step)."""
        return st.layers()

    def advanced(
        self, st: SequenceState, layers: list[Any], *, tokens: int, next_chunk: int
    ) -> SequenceState:
        """The state after `apply` consumed ``tokens`` more tokens, ending in ``layers``."""
        return SequenceState.from_layers(
            st.seq_id, st.position + tokens, next_chunk, layers, self.fingerprint
        )

    def tokens(self, data: Any) -> int:
        raise NotImplementedError

    def apply(self, data: Any, layers: list[Any]) -> tuple[np.ndarray, list[Any]]:
        """(per-token outputs, the states after the chunk)."""
        raise NotImplementedError

    def restore_message(self, ex: CheckpointError) -> str:
        """The dead-letter message of a checkpoint that could not be restored."""
        return str(ex)


def _check_numeric(name: str, arr: Any, kinds: str, what: str) -> np.ndarray:
    if isinstance(arr, Unencodable):
        raise BadInput(BAD_DTYPE, f"{name}: expected {what}, got {arr.description}")
    if not isinstance(arr, np.ndarray):
        try:
            arr = np.asarray(arr)
        except (ValueError, TypeError) as ex:
            raise BadInput(BAD_DTYPE, f"{name}: expected {what}, got {type(arr).__name__}") from ex
    if arr.dtype.kind not in kinds:
        raise BadInput(BAD_DTYPE, f"{name}: expected {what}, got dtype {arr.dtype}")
    return arr


def _check_finite(name: str, arr: np.ndarray) -> None:
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = np.flatnonzero(~np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1))
        raise BadInput(
            NON_FINITE,
            f"{name}: expected finite values, found NaN/Inf at token(s) {bad[:5].tolist()}"
            + (" ..." if bad.size > 5 else ""),
        )


def _digest(obj: Any, arrays: Mapping[str, np.ndarray] | None = None) -> str:
    h = hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())
    for key in sorted(arrays or {}):
        a = np.ascontiguousarray((arrays or {})[key])
        h.update(key.encode() + a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes())
    return h.hexdigest()


class RawAttentionStep(ChunkStep):
    """Causal linear attention over payloads {"q": [T, H, d_k], "k": [T, H, d_k], "v": [T, H, d_v]}
    plus the rule's per-token inputs: "log_alpha" [T, H] (gated, gated_delta) and "beta" [T, H]
    (delta, gated_delta).

    The state has one layer: S [1, H, F, d_v], z [1, H, F].  A sequence's first chunk fixes H,
    d_k and d_v; later chunks with other shapes are dead-lettered (`bad_shape`).  The rule and
    its fixed parameters (gamma, normalize) are part of the fingerprint; the additive rule's
    fingerprint is the one it had before rules existed.
    """

    def __init__(
        self,
        feature_map: Any = "elu+1",
        eps: float = 1e-6,
        backend: str = "auto",
        state_dtype: Any = np.float64,
        *,
        rule: str = "additive",
        gamma: Any = None,
        normalize: bool = True,
    ) -> None:
        self.feature_map = get_feature_map(feature_map)
        self.eps = float(eps)
        self.backend = backend
        self.state_dtype = np.dtype(state_dtype)
        self.rule = RuleSpec(rule, gamma, normalize, backend)
        config = self.rule.config()
        if config is None:
            self.fingerprint = self._additive_fingerprint()
        else:
            record = json.dumps(config, sort_keys=True, separators=(",", ":"))
            self.fingerprint = f"{_digest({**self._base(), 'rule': config})} {record}"
        self._keys = ("q", "k", "v", *self.rule.inputs)

    def _base(self) -> dict[str, Any]:
        """What every rule's fingerprint records: the kind of step, feature map and eps."""
        return {"kind": "raw-attention", "feature_map": self.feature_map.config(), "eps": self.eps}

    def _additive_fingerprint(self) -> str:
        """The additive rule's fingerprint (the one from before rules existed)."""
        return _digest(self._base())

    def setup(self) -> None:
        if self.backend in ("auto", "numba"):
            # Compile (or load from Numba's cache) before the first real chunk.
            h = self.rule.heads() or 1
            x = np.zeros((2, h, 2), dtype=np.float32)
            per_token = {"log_alpha": np.zeros((2, h)), "beta": np.ones((2, h))}
            causal_linear_attention(
                x,
                x,
                x,
                feature_map=self.feature_map,
                eps=self.eps,
                backend=self.backend,
                **self.rule.kwargs(per_token),
            )

    def _keys_message(self, missing: list[str], extra: list[str]) -> str:
        msg = (
            f"expected keys {json.dumps(sorted(self._keys))}, missing {missing}, unexpected {extra}"
        )
        if self.rule.rule != "additive" or any(n in extra for n in EXPECTED_VALUES):
            inputs = " and ".join(f'"{n}" [T, H]' for n in self.rule.inputs) or "none"
            msg += f" (per-token inputs of {self.rule.label()}: {inputs})"
        return msg

    def validate(self, data: Any) -> dict[str, np.ndarray]:
        if isinstance(data, Unencodable) or not isinstance(data, Mapping):
            raise BadInput(
                BAD_PAYLOAD,
                f'expected a mapping {{"q", "k", "v"}} of [T, H, d] arrays, got {_short(data)}',
            )
        missing = sorted(set(self._keys) - set(data))
        extra = sorted(set(data) - set(self._keys))
        if missing or extra:
            raise BadInput(BAD_PAYLOAD, self._keys_message(missing, extra))
        out = {n: _check_numeric(n, data[n], "f", "a float32 or float64 array") for n in "qkv"}
        for name, arr in out.items():
            if arr.ndim != 3:
                raise BadInput(
                    BAD_SHAPE, f"{name}: expected [T, H, d], got shape {list(arr.shape)}"
                )
        q, k, v = out["q"], out["k"], out["v"]
        if q.shape[0] == 0:
            raise BadInput(EMPTY_CHUNK, "expected at least one token, got T=0")
        if q.shape != k.shape or v.shape[:2] != q.shape[:2]:
            raise BadInput(
                BAD_SHAPE,
                f"expected q, k [T, H, d_k] and v [T, H, d_v] with the same T and H, got "
                f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}",
            )
        for name, arr in out.items():
            _check_finite(name, arr)
        t, h = q.shape[:2]
        heads = self.rule.heads()
        if heads is not None and h != heads:
            raise BadInput(
                BAD_SHAPE,
                f"expected H = {heads} heads (gamma of {self.rule.label()} has one per head), "
                f"got q {list(q.shape)}",
            )
        for name in self.rule.inputs:
            out[name] = _check_per_token(name, data[name], t, h)
        return out

    def state_shape(self, data: Any) -> tuple[int, int, int, int]:
        _t, h, dk = data["q"].shape
        return (1, h, self.feature_map.out_dim(dk), data["v"].shape[2])

    def tokens(self, data: Any) -> int:
        return int(data["q"].shape[0])

    def apply(self, data: Any, layers: list[AttentionState]) -> tuple[np.ndarray, list[Any]]:
        st = layers[0]
        _l, h, f, dv = self.state_shape(data)
        if st.S.shape != (h, f, dv):
            raise BadInput(
                BAD_SHAPE,
                f"expected q, k [T, {st.S.shape[0]}, d_k] with {st.S.shape[1]} features and "
                f"v [T, {st.S.shape[0]}, {st.S.shape[2]}] as in the sequence's earlier chunks, "
                f"got q {list(data['q'].shape)}, v {list(data['v'].shape)}",
            )
        out, new = causal_linear_attention(
            data["q"],
            data["k"],
            data["v"],
            st,
            feature_map=self.feature_map,
            eps=self.eps,
            backend=self.backend,
            **self.rule.kwargs(data),
        )
        return out, [new]

    def restore_message(self, ex: CheckpointError) -> str:
        found = getattr(ex, "found", None)
        if not isinstance(ex, ModelMismatchError) or not found:
            return str(ex)
        theirs = describe_fingerprint(found, self._additive_fingerprint(), self.rule.config())
        return (
            f"{ex}; the checkpoint was written under {theirs}, this job runs "
            f"{self.rule.label()}: a sequence continues under the rule and parameters it started "
            "with (resume with those, or use a fresh checkpoint folder)"
        )


def _check_per_token(name: str, value: Any, t: int, h: int) -> np.ndarray:
    """A rule's per-token input: a real [T, H] array, finite, in its range."""
    arr = _check_numeric(name, value, "fiu", f"a real array [T, H] = [{t}, {h}]")
    if arr.shape != (t, h):
        raise BadInput(
            BAD_SHAPE,
            f"{name}: expected [T, H] = [{t}, {h}] (one per token and head of q), got shape "
            f"{list(arr.shape)}",
        )
    _check_finite(name, arr)
    ok = arr <= 0 if name == "log_alpha" else (arr > 0) & (arr <= 1)
    if not ok.all():
        bad = np.argwhere(~ok)
        tok, head = (int(i) for i in bad[0])
        raise BadInput(
            INVALID_INPUT,
            f"{name}: expected {EXPECTED_VALUES[name]}, got {arr[tok, head].item()!r} at token "
            f"{tok}, head {head} ({len(bad)} value(s) out of range)",
        )
    return arr


#: One `Shared` handle per model (fingerprint and compute dtype) in this process: every DoFn
#: instance of every step with that model holds the same loaded copy.
_SHARED_MODELS: dict[str, Any] = {}
_SHARED_LOCK = threading.Lock()


def _shared_handle(tag: str) -> Any:
    """Beam's `Shared` handle of model ``tag`` (only a step a worker unpickled loads through
    it: the engine's one Beam import, made there)."""
    from apache_beam.utils.shared import Shared

    with _SHARED_LOCK:
        return _SHARED_MODELS.setdefault(tag, Shared())


def _portable_source(model: StreamingModel) -> str | bytes:
    """What a worker loads a passed-in model from: its built-in name or URL when it came from
    one, a checkpoint folder's absolute path (a worker must see the same folder: use a URL on
    a cluster), else its safetensors bytes (a local path may not exist on a remote worker)."""
    source = str(getattr(model, "source", ""))
    if source.startswith("builtin:") or ("://" in source and not source.startswith("file://")):
        return source
    from linstream.ops.model.runtime import is_model_folder

    local = source.removeprefix("file://")
    if local and is_model_folder(local):
        return os.path.abspath(local)
    from linstream.ops.model.weights import write_model_bytes

    m: Any = model
    return write_model_bytes(m.config, m.weights)


def _mode_name(dtype: Any) -> str:
    """A compute dtype's name as a model names its mode ("float32", "float64", "bfloat16")."""
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


class EmbedStep(ChunkStep):
    """The embedding model over token ids [T] (int) or feature vectors [T, input_dim] (float).

    `model` is a spec for `linstream.ops.load_model` ("builtin:default", a .safetensors path
    or URL, a checkpoint folder in fla's format or its URL) or a loaded model (any
    `linstream.ops.model.protocol.StreamingModel`).  The step carries only the spec (a loaded
    model: its built-in name, URL or folder, else its safetensors bytes, formed when the step is
    pickled) and the fingerprint, never the loaded weights; `setup()` loads the model once per
    worker process (`apache_beam.utils.shared.Shared`) and refuses a file whose fingerprint
    changed since the job was built.  `layer` (a model that gives every layer's output, as a
    checkpoint folder's does): emit hidden state N (0 the embeddings .. L the final norm, the
    default) instead.  `compute_dtype`: how a spec is loaded (float32 by default, float64, or
    bfloat16 for a checkpoint folder); the workers load the model in that mode too; with a
    loaded model it must name the model's own mode (ValueError otherwise).  Every entry point
    (the command line's job, `EmbedSequences`, `embed()` and `Resumable`) loads its model here,
    or hands it over loaded: `preloaded`, the model already loaded from the spec `model` in that
    mode (the job loads it once, where it checks the output folder), so that it is not loaded
    again here.
    """

    def __init__(
        self,
        model: Any,
        backend: str = "auto",
        state_dtype: Any = np.float64,
        *,
        layer: int | None = None,
        compute_dtype: Any = None,
        preloaded: StreamingModel | None = None,
    ) -> None:
        self.backend = backend
        self.state_dtype = np.dtype(state_dtype)
        loaded: StreamingModel
        if isinstance(model, str):
            from linstream.ops import load_model

            self._source: str | bytes | None = model
            # Loaded here too: the fingerprint names the model in checkpoints.
            loaded = (
                preloaded
                if preloaded is not None
                else load_model(model, compute_dtype=compute_dtype or np.float32)
            )
        else:
            self._source = None  # formed from the model when the step is pickled
            loaded = model
        self._model: StreamingModel | None = loaded
        # a checkpoint folder's model names its mode (bfloat16 computes in float32)
        mode = getattr(loaded, "compute_mode", None)
        self.compute_dtype = str(mode or np.dtype(loaded.compute_dtype))
        asked = None if compute_dtype is None else _mode_name(compute_dtype)
        if asked is not None and asked != self.compute_dtype:
            msg = (
                f"compute_dtype {asked}: the model given was loaded in {self.compute_dtype} "
                f"(give its path instead, or load it with compute_dtype={asked!r})"
            )
            raise ValueError(msg)
        self.fingerprint = str(loaded.fingerprint)
        # The built-in model's per-layer states are (S, z) pairs: the stage packs and stacks
        # them itself (`Working`); any other model's go through its stack/unstack_states.
        self.stacks_layers = all(
            isinstance(s, AttentionState) for s in loaded.initial_states(self.state_dtype)
        )
        self.layer = _checked_layer(layer, loaded)

    def _label(self) -> str:
        if self._source is None:
            return str(getattr(self._model, "source", "<model>"))
        return self._source if isinstance(self._source, str) else "<model bytes>"

    def _load_checked(self) -> StreamingModel:
        from linstream.ops import load_model

        assert self._source is not None
        model: StreamingModel = load_model(self._source, compute_dtype=self.compute_dtype)
        if model.fingerprint != self.fingerprint:
            msg = (
                f"model {self._label()}: fingerprint {model.fingerprint[:16]}..., expected "
                f"{self.fingerprint[:16]}... (the file changed after the job was built)"
            )
            raise ValueError(msg)
        return model

    def _load(self) -> StreamingModel:
        if self._model is None:
            tag = f"{self.fingerprint}/{self.compute_dtype}"
            self._model = _shared_handle(tag).acquire(self._load_checked, tag)
        return self._model

    def __getstate__(self) -> dict[str, Any]:
        if self._source is None:  # formed once, on the first pickling
            assert self._model is not None
            self._source = _portable_source(self._model)
        state = dict(self.__dict__)
        state["_model"] = None  # loaded in setup() on the worker, never shipped
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def model(self) -> StreamingModel:
        return self._load()

    def setup(self) -> None:
        model = self._load()
        cfg = model.config
        warm = (
            np.zeros(4, dtype=np.int32)
            if cfg.input_kind == "tokens"
            else np.zeros((4, cfg.input_dim or 0), dtype=np.float32)
        )
        # Compiles the kernels (or loads Numba's on-disk cache) before the first real chunk.
        model.embed_chunk(warm, model.initial_states(self.state_dtype), backend=self.backend)

    def validate(self, data: Any) -> np.ndarray:
        model = self.model
        cfg = model.config
        if isinstance(data, Mapping):
            key = "tokens" if cfg.input_kind == "tokens" else "features"
            if set(data) != {key}:
                raise BadInput(
                    BAD_PAYLOAD,
                    f"expected an array or {{{key!r}: array}}, got keys {sorted(data)}",
                )
            data = data[key]
        if cfg.input_kind == "tokens":
            arr = _check_numeric("tokens", data, "iu", "integer token ids [T]")
            if arr.ndim != 1:
                raise BadInput(BAD_SHAPE, f"tokens: expected [T], got shape {list(arr.shape)}")
            if arr.size == 0:
                raise BadInput(EMPTY_CHUNK, "expected at least one token, got T=0")
        else:
            arr = _check_numeric("features", data, "f", "float feature vectors [T, input_dim]")
            if arr.ndim != 2 or arr.shape[1] != cfg.input_dim:
                raise BadInput(
                    BAD_SHAPE,
                    f"features: expected [T, {cfg.input_dim}], got shape {list(arr.shape)}",
                )
            if arr.shape[0] == 0:
                raise BadInput(EMPTY_CHUNK, "expected at least one token, got T=0")
            _check_finite("features", arr)
            arr = arr.astype(np.float32, copy=False)
        try:
            model.check_inputs(arr)
        except UnknownTokenError as ex:
            raise BadInput(
                UNKNOWN_TOKEN,
                f"expected token ids in [0, {ex.vocab_size}), got {ex.token} at token "
                f"{ex.position} ({ex.count} out of range)",
            ) from ex
        except (ValueError, TypeError) as ex:
            raise BadInput(INVALID_INPUT, str(ex)) from ex
        return arr

    def state_shape(self, data: Any) -> tuple[int, int, int, int]:
        shape = tuple(self.model.state_layout()[0][1])  # S [L, H, d_k, d_v]
        return (shape[0], shape[1], shape[2], shape[3])

    def initial_state(self, seq_id: str, data: Any) -> SequenceState:
        layout = self.model.state_layout()
        return SequenceState.initial(seq_id, layout, self.fingerprint, dtype=self.state_dtype)

    def carried(self, st: SequenceState) -> list[Any]:
        if self.stacks_layers:
            return super().carried(st)
        return list(self.model.unstack_states(st.tensors, st.position))

    def advanced(
        self, st: SequenceState, layers: list[Any], *, tokens: int, next_chunk: int
    ) -> SequenceState:
        if self.stacks_layers:
            return super().advanced(st, layers, tokens=tokens, next_chunk=next_chunk)
        position = st.position + tokens
        arrays = self.model.stack_states(layers, position)
        S = arrays.pop("S")
        return SequenceState(
            st.seq_id, position, next_chunk, S, arrays.pop("z", None), self.fingerprint, arrays
        )

    def tokens(self, data: Any) -> int:
        return int(data.shape[0])

    def apply(self, data: Any, layers: list[Any]) -> tuple[np.ndarray, list[Any]]:
        model: Any = self.model
        if self.layer is None:
            emb, new = model.embed_chunk(data, layers, backend=self.backend)
        else:
            emb, new = model.embed_chunk(data, layers, backend=self.backend, layer=self.layer)
        return emb, list(new)


def _short(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"array of shape {list(x.shape)} and dtype {x.dtype}"
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."
