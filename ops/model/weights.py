"""The embedding model's weights: names and shapes, a fixed initialization, the safetensors file
format, and the fingerprint.  NumPy only (no torch): the runtime, the twin and the built-in
model's script all go through here, so there is one file format.

File format: a safetensors file whose metadata holds
    "format": "linstream-model", "format_version": "1", "config": ModelConfig.to_json()
and whose tensors are exactly `weight_specs(config)`: the float32 weights named as the PyTorch
twin's `state_dict()` names them (a layer whose rule has a gate or β adds its projections,
`layers.i.attn.gate.*` / `layers.i.attn.beta.*`: [n_heads, d_model] and [n_heads]), plus the
feature map's parameters as `feature_map.<name>` (for FAVOR+ its random matrix), which must equal
what the config's map generates.  A file is
untrusted input: the header is read and checked (names, dtypes, shapes) before any tensor is, and
every refusal names the tensor and says what was expected.

(About 400 lines: the file format's writer and its untrusted reader side by side, so that a change
to one is seen beside the other.)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from linstream.ops.feature_maps import get_feature_map

from .config import ModelConfig

__all__ = [
    "BETA_RULES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GATED_RULES",
    "ModelFileError",
    "TensorSpec",
    "check_tensors",
    "feature_map_params",
    "fingerprint",
    "init_weights",
    "read_model",
    "read_model_header",
    "weight_specs",
    "write_model",
    "write_model_bytes",
]

FORMAT_NAME = "linstream-model"
FORMAT_VERSION = "1"
_FINGERPRINT_TAG = b"linstream-model-fingerprint-v1"
_MAX_HEADER = 16 << 20  # a header is a few KB; refuse absurd sizes before parsing them
_ST_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
_NP_TO_ST = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
FEATURE_MAP_PREFIX = "feature_map."
# Rules whose layers carry a gate projection (attn.gate.*), and a β projection (attn.beta.*).
GATED_RULES = ("gated", "gated_delta")
BETA_RULES = ("delta", "gated_delta")


class ModelFileError(ValueError):
    """A model file that cannot be used: malformed, wrong format, or tensors that do not fit."""


@dataclass(frozen=True)
class TensorSpec:
    """What one stored tensor must be.  `role` says how `init_weights` fills it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    role: str  # "embedding" | "linear" | "linear_out" | "bias" | "norm_weight" | "feature_map"


def feature_map_params(config: ModelConfig) -> dict[str, np.ndarray]:
    """The feature map's parameter arrays for d_head-wide inputs (empty for elu+1, relu, ...)."""
    params = get_feature_map(config.feature_map).params(config.d_head)
    return {str(k): np.ascontiguousarray(v) for k, v in params.items()}


def weight_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of a model file, in a fixed order (the order `init_weights` draws them)."""
    f32 = np.dtype(np.float32)
    d, a, ff = config.d_model, config.d_attn, config.d_ff
    specs: dict[str, TensorSpec] = {}

    def norm(prefix: str) -> None:
        specs[f"{prefix}.weight"] = TensorSpec((d,), f32, "norm_weight")
        if config.normalization == "layernorm":
            specs[f"{prefix}.bias"] = TensorSpec((d,), f32, "bias")

    if config.input_kind == "tokens":
        assert config.vocab_size is not None
        specs["embed.weight"] = TensorSpec((config.vocab_size, d), f32, "embedding")
    else:
        assert config.input_dim is not None
        specs["input_proj.weight"] = TensorSpec((d, config.input_dim), f32, "linear")
        specs["input_proj.bias"] = TensorSpec((d,), f32, "bias")
    for i in range(config.n_layers):
        p = f"layers.{i}"
        norm(f"{p}.norm1")
        for name in ("q", "k", "v"):
            specs[f"{p}.attn.{name}.weight"] = TensorSpec((a, d), f32, "linear")
        rule = config.layer_rule(i)["rule"]
        # one logit per head and token: the gate (log α) and β projections of the rule
        for proj in ("gate",) * (rule in GATED_RULES) + ("beta",) * (rule in BETA_RULES):
            specs[f"{p}.attn.{proj}.weight"] = TensorSpec((config.n_heads, d), f32, "linear")
            specs[f"{p}.attn.{proj}.bias"] = TensorSpec((config.n_heads,), f32, "bias")
        specs[f"{p}.attn.o.weight"] = TensorSpec((d, a), f32, "linear_out")
        norm(f"{p}.norm2")
        specs[f"{p}.ff.up.weight"] = TensorSpec((ff, d), f32, "linear")
        specs[f"{p}.ff.up.bias"] = TensorSpec((ff,), f32, "bias")
        specs[f"{p}.ff.down.weight"] = TensorSpec((d, ff), f32, "linear_out")
        specs[f"{p}.ff.down.bias"] = TensorSpec((d,), f32, "bias")
    norm("final_norm")
    for name, arr in feature_map_params(config).items():
        specs[FEATURE_MAP_PREFIX + name] = TensorSpec(tuple(arr.shape), arr.dtype, "feature_map")
    return specs


def init_weights(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """The fixed, documented initialization, reproducible from `seed` on any machine.

    One `np.random.default_rng(seed)` draws, in `weight_specs` order, float64 standard normals
    that are then scaled and rounded to float32:
      embedding        N(0, 1)                      (the residual stream starts at unit scale)
      linear           N(0, 1) / sqrt(fan_in)
      linear_out       N(0, 1) / sqrt(fan_in · 2 · n_layers)   (attn.o and ff.down: each of
                                                    the 2·n_layers residual branches adds a
                                                    fraction, so the stream stays near unit scale)
    Biases are 0 and norm weights 1 (nothing drawn); the feature map's parameters come from its
    own config (FAVOR+'s seed), not from this generator.
    """
    rng = np.random.default_rng(seed)
    fm_params = feature_map_params(config)
    out: dict[str, np.ndarray] = {}
    for name, spec in weight_specs(config).items():
        if spec.role == "embedding":
            w = rng.standard_normal(spec.shape)
        elif spec.role in ("linear", "linear_out"):
            fan_in = spec.shape[1]
            scale = 1.0 / np.sqrt(fan_in)
            if spec.role == "linear_out":
                scale /= np.sqrt(2.0 * config.n_layers)
            w = rng.standard_normal(spec.shape) * scale
        elif spec.role == "bias":
            w = np.zeros(spec.shape)
        elif spec.role == "norm_weight":
            w = np.ones(spec.shape)
        else:
            out[name] = fm_params[name.removeprefix(FEATURE_MAP_PREFIX)].copy()
            continue
        out[name] = np.ascontiguousarray(w, dtype=spec.dtype)
    return out


# -- fingerprint --------------------------------------------------------------------------------
def _le_bytes(arr: np.ndarray) -> bytes:
    a = np.asarray(arr)
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def fingerprint(config: ModelConfig, weights: Mapping[str, np.ndarray]) -> str:
    """Hex sha256 over the canonical config JSON (which holds each layer's rule and its
    parameters), every tensor's name, dtype, shape and bytes (sorted by name, little-endian;
    the gate and β projections among them), the feature map's parameters as its config
    generates them, and the map's state constants (FAVOR+'s key shift b, only where b > 0, so
    maps with b = 0 keep their fingerprints).  Every field is length-prefixed, so no two
    different models hash the same text."""
    h = hashlib.sha256()

    def put(b: bytes) -> None:
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)

    def put_arrays(arrays: Mapping[str, np.ndarray]) -> None:
        put(str(len(arrays)).encode())
        for name in sorted(arrays):
            a = np.asarray(arrays[name])
            put(name.encode())
            put(a.dtype.newbyteorder("<").str.encode())
            put(json.dumps([int(n) for n in a.shape]).encode())
            put(_le_bytes(a))

    put(_FINGERPRINT_TAG)
    put(config.to_json().encode())
    put(b"weights")
    put_arrays(weights)
    put(b"feature_map_params")
    put_arrays(feature_map_params(config))
    constants = get_feature_map(config.feature_map).state_constants(config.d_head)
    if constants:
        put(b"feature_map_state_constants")
        put(json.dumps(constants, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


# -- writing ------------------------------------------------------------------------------------
def _checked_tensors(config: ModelConfig, weights: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The tensors to store, checked against the specs (a writer must not make refused files)."""
    tensors = {name: np.ascontiguousarray(np.asarray(w)) for name, w in weights.items()}
    check_tensors(config, tensors, source="weights to save")
    return tensors


def _metadata(config: ModelConfig, tokenizer: str | None = None) -> dict[str, str]:
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "config": config.to_json()}
    if tokenizer:
        meta["tokenizer"] = tokenizer
    return meta


def write_model(
    path: str | os.PathLike[str],
    config: ModelConfig,
    weights: Mapping[str, Any],
    *,
    tokenizer: str | None = None,
) -> None:
    """Write a model file (safetensors, config JSON in the metadata).  Refuses weights that do
    not match `weight_specs(config)`, so every written file loads.  `tokenizer` names the
    tokenizer its token ids come from (`builtin:bytes`, or a tokenizer.json path or URL; a
    relative path is relative to the model file's folder), under the metadata key `tokenizer`."""
    data = write_model_bytes(config, weights, tokenizer=tokenizer)
    target = os.fspath(path)
    tmp = f"{target}.tmp-{os.getpid()}"
    try:  # write then rename: a crash never leaves a half-written model under the real name
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_model_bytes(
    config: ModelConfig, weights: Mapping[str, Any], *, tokenizer: str | None = None
) -> bytes:
    """The bytes `write_model` would write."""
    from safetensors.numpy import save

    meta = _metadata(config, tokenizer)
    return bytes(save(_checked_tensors(config, weights), metadata=meta))


# -- reading ------------------------------------------------------------------------------------
def _read_header(data: bytes, source: str) -> dict[str, Any]:
    if len(data) < 8:
        msg = f"{source}: not a safetensors file (only {len(data)} bytes)"
        raise ModelFileError(msg)
    n = int.from_bytes(data[:8], "little")
    if n > _MAX_HEADER or 8 + n > len(data):
        msg = (
            f"{source}: not a safetensors file or truncated (header of {n} bytes announced, "
            f"file has {len(data)} bytes)"
        )
        raise ModelFileError(msg)
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        msg = f"{source}: safetensors header is not valid JSON ({ex})"
        raise ModelFileError(msg) from ex
    if not isinstance(header, dict):
        msg = f"{source}: safetensors header must be a JSON object, got {type(header).__name__}"
        raise ModelFileError(msg)
    return header


def _config_from_header(header: dict[str, Any], source: str) -> ModelConfig:
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        msg = (
            f"{source}: not a linstream model file (safetensors metadata must hold "
            f"format={FORMAT_NAME!r} and the model config; found metadata {meta!r:.200})"
        )
        raise ModelFileError(msg)
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        msg = (
            f"{source}: model file format_version {version!r} is not supported; this linstream "
            f"reads format_version {FORMAT_VERSION!r} (upgrade linstream for newer files)"
        )
        raise ModelFileError(msg)
    try:
        return ModelConfig.from_json(meta.get("config", ""))
    except (TypeError, ValueError) as ex:
        msg = f"{source}: the model config in the file's metadata is invalid: {ex}"
        raise ModelFileError(msg) from ex


def read_model_header(data: bytes, *, name: str = "<model>") -> tuple[ModelConfig, str | None]:
    """(config, named tokenizer or None) from a model file's first bytes (the 8-byte length and
    the JSON header are enough), without reading the tensors."""
    header = _read_header(data, name)
    config = _config_from_header(header, name)
    tokenizer = header["__metadata__"].get("tokenizer")
    return config, tokenizer if isinstance(tokenizer, str) and tokenizer else None


def _check_header_tensors(config: ModelConfig, header: dict[str, Any], source: str) -> None:
    """Names, dtypes and shapes from the header, before any tensor is read."""
    specs = weight_specs(config)
    found = {k: v for k, v in header.items() if k != "__metadata__"}
    missing = [n for n in specs if n not in found]
    if missing:
        msg = (
            f"{source}: missing tensor {missing[0]!r}"
            + (f" (and {len(missing) - 1} more: {missing[1:4]})" if len(missing) > 1 else "")
            + f"; a model with this config needs {len(specs)} tensors"
        )
        raise ModelFileError(msg)
    extra = sorted(n for n in found if n not in specs)
    if extra:
        msg = f"{source}: unexpected tensor {extra[0]!r} (not part of a model with this config)"
        raise ModelFileError(msg)
    for name, spec in specs.items():
        info = found[name]
        if not isinstance(info, dict):
            msg = f"{source}: tensor {name!r} has a malformed header entry"
            raise ModelFileError(msg)
        want = _NP_TO_ST.get(spec.dtype, spec.dtype.str)
        if info.get("dtype") != want:
            msg = (
                f"{source}: tensor {name!r} has dtype {info.get('dtype')}, expected {want} "
                f"({spec.dtype})"
            )
            raise ModelFileError(msg)
        shape = info.get("shape")
        if not isinstance(shape, list) or tuple(shape) != spec.shape:
            msg = f"{source}: tensor {name!r} has shape {shape}, expected {list(spec.shape)}"
            raise ModelFileError(msg)


def check_tensors(config: ModelConfig, tensors: Mapping[str, np.ndarray], *, source: str) -> None:
    """Check loaded tensors: the set of names, dtypes, shapes, finite values, and that the
    feature map's stored parameters equal the ones its config generates."""
    specs = weight_specs(config)
    missing = [n for n in specs if n not in tensors]
    if missing:
        msg = f"{source}: missing tensor {missing[0]!r} ({len(missing)} missing in all)"
        raise ModelFileError(msg)
    extra = sorted(n for n in tensors if n not in specs)
    if extra:
        msg = f"{source}: unexpected tensor {extra[0]!r} (not part of a model with this config)"
        raise ModelFileError(msg)
    fm_params = feature_map_params(config)
    for name, spec in specs.items():
        t = tensors[name]
        if t.dtype != spec.dtype:
            msg = f"{source}: tensor {name!r} has dtype {t.dtype}, expected {spec.dtype}"
            raise ModelFileError(msg)
        if tuple(t.shape) != spec.shape:
            msg = (
                f"{source}: tensor {name!r} has shape {list(t.shape)}, expected {list(spec.shape)}"
            )
            raise ModelFileError(msg)
        if not np.isfinite(t).all():
            bad = int(np.size(t) - np.count_nonzero(np.isfinite(t)))
            msg = f"{source}: tensor {name!r} holds {bad} NaN or Inf value(s)"
            raise ModelFileError(msg)
        if spec.role == "feature_map":
            key = name.removeprefix(FEATURE_MAP_PREFIX)
            if not np.array_equal(t, fm_params[key]):
                msg = (
                    f"{source}: tensor {name!r} differs from the parameters the feature map "
                    f"{config.feature_map} generates; the file was written with another "
                    "version of the feature map, and its embeddings cannot be reproduced here"
                )
                raise ModelFileError(msg)


def _read_file(path: str) -> bytes:
    if "://" not in path or path.startswith("file://"):
        with open(path.removeprefix("file://"), "rb") as fh:
            return fh.read()
    import fsspec

    with fsspec.open(path, "rb") as fh:
        return bytes(fh.read())


def read_model(
    source: str | os.PathLike[str] | bytes, *, name: str | None = None
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Read and check a model file (a path, or the file's bytes).  Returns (config, tensors).

    A path may be a URL of any filesystem fsspec knows (``gs://``, ``s3://``, ``memory://``;
    gcsfs or s3fs installed by the ``gcp`` / ``aws`` extras).

    Raises ModelFileError (a ValueError) naming the file and, where it is one tensor's fault,
    the tensor; FileNotFoundError for a missing path.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        label = name or "<model bytes>"
    else:
        label = name or os.fspath(source)
        data = _read_file(os.fspath(source))
    header = _read_header(data, label)
    config = _config_from_header(header, label)
    _check_header_tensors(config, header, label)
    from safetensors.numpy import load

    try:
        tensors = load(data)
    except Exception as ex:  # safetensors raises its own error type for malformed data
        msg = f"{label}: safetensors could not read the tensors: {ex}"
        raise ModelFileError(msg) from ex
    check_tensors(config, tensors, source=label)
    return config, {k: np.ascontiguousarray(v) for k, v in tensors.items()}
