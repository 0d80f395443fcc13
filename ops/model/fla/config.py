"""An fla checkpoint's config.json, read as flash-linear-attention 0.6.0 reads it.

    config = parse_config(json.loads(text), source="path/to/folder")  # or ModelFolderError

Every key is accounted for: keys that shape the forward are read with fla 0.6.0's defaults for
the family (one module per family in this package says which), keys that cannot change the
hidden states (training switches, the output head, token ids, Hugging Face bookkeeping) are
accepted, and any other key or value is refused in one line naming the option and the value:
hybrid softmax-attention layers (`attn`), a feature map or activation the runtime lacks, keys
fla 0.6.0 itself ignores although the checkpoint's training code may have honoured them (GLA's
`gate_logit_normalizer` other than 16, RetNet's `use_short_conv`, DeltaNet's `use_output_norm`
off, ...), and keys unknown to fla 0.6.0.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from linstream.ops.model.weights import ModelFileError

__all__ = [
    "FAMILIES",
    "CommonConfig",
    "ConfigReader",
    "FlaConfig",
    "ModelFolderError",
    "parse_config",
    "refuse_hybrid",
    "standard_common",
]

#: model_type values this runtime runs (each a module of this package).
FAMILIES = ("gla", "retnet", "delta_net", "gated_deltanet", "hgrn2", "mamba2", "rwkv7")

# Keys that cannot change the hidden states: Hugging Face bookkeeping, token ids, the output
# head (tie_word_embeddings), training-only switches (losses, initialization, fused kernels
# that compute the same function), and the position limit only hybrid attention layers read.
_INERT_KEYS = frozenset(
    {
        "architectures",
        "auto_map",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "_name_or_path",
        "name_or_path",
        "use_cache",
        "initializer_range",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "tie_word_embeddings",
        "max_position_embeddings",
        "fuse_cross_entropy",
        "fuse_linear_cross_entropy",
        "use_l2warp",
        "fuse_swiglu",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "id2label",
        "label2id",
        "problem_type",
        "tokenizer_class",
        "keys_to_ignore_at_inference",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "prefix",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
        "finetuning_task",
        "torchscript",
        "use_bfloat16",
        "pruned_heads",
        "tf_legacy_loss",
        "cross_attention_hidden_size",
    }
)


class ModelFolderError(ModelFileError):
    """A checkpoint folder that cannot be run: missing or malformed files, a config option the
    runtime does not implement, tensors that do not fit the config."""


class ConfigReader:
    """Reads config.json's keys with defaults and types, remembering which were read."""

    def __init__(self, raw: Mapping[str, Any], source: str) -> None:
        self.raw = dict(raw)
        self.source = source
        self.family = str(raw.get("model_type"))
        self.read: set[str] = set(_INERT_KEYS)

    def fail(self, msg: str) -> NoReturn:
        """Raise ModelFolderError for this config: the source, then msg."""
        text = f"{self.source}: {msg}"
        raise ModelFolderError(text)

    def refuse(self, key: str, value: Any, why: str) -> NoReturn:
        """Raise the one-line refusal of an option: its name, its value, why."""
        self.fail(f"config option {key} = {json.dumps(value)} is not supported: {why}")

    def get(self, key: str, default: Any, kind: str) -> Any:
        """The value of key (default when absent or null where null is allowed), checked:
        kind "int", "pos_int", "float", "pos_float", "bool", "str", or "…?" (null allowed)."""
        self.read.add(key)
        optional = kind.endswith("?")
        base = kind.rstrip("?")
        value = self.raw.get(key, default)
        if value is None and (optional or key not in self.raw):
            return None if optional else default
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "pos_int": isinstance(value, int) and not isinstance(value, bool) and value > 0,
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "pos_float": isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > 0,
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
        }[base]
        if not ok:
            want = {
                "int": "an integer",
                "pos_int": "a positive integer",
                "float": "a number",
                "pos_float": "a positive number",
                "bool": "true or false",
                "str": "a string",
            }[base]
            self.fail(f"config option {key} = {json.dumps(value)}: expected {want}")
        return float(value) if base in ("float", "pos_float") else value

    def require(self, key: str, value: Any, allowed: tuple[Any, ...], why: str) -> None:
        """Refuse key's value unless it is one of `allowed`."""
        if value not in allowed:
            self.refuse(key, value, why)

    def only_default(self, key: str, default: Any, why: str) -> None:
        """A key fla 0.6.0 ignores: accepted at its hard-coded value (or absent), else refused."""
        self.read.add(key)
        if key in self.raw and self.raw[key] != default and self.raw[key] is not None:
            self.refuse(key, self.raw[key], why)

    def check_all_read(self) -> None:
        unknown = sorted(k for k in self.raw if k not in self.read)
        if unknown:
            key = unknown[0]
            self.refuse(
                key,
                self.raw[key],
                f"not a key of fla 0.6.0's {self.family} config, so what it does to the "
                "forward is unknown",
            )


@dataclass(frozen=True)
class CommonConfig:
    """What every family's model shares: the widths, the depth, the vocabulary, the norms' eps,
    the MLP's width (fla's standard block: pre-norm, SwiGLU)."""

    family: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    norm_eps: float
    intermediate_size: int


@dataclass(frozen=True)
class FlaConfig:
    """A parsed config: the shared part and the family's layer settings (a frozen dataclass of
    the family module; every layer of these models has the same settings)."""

    common: CommonConfig
    layer: Any

    def describe(self) -> dict[str, Any]:
        """A JSON-able description of everything that shapes the forward (the fingerprint's)."""
        return {"common": asdict(self.common), "layer": asdict(self.layer)}

    # What the pipeline reads of any model's config (the built-in model's ModelConfig names):
    # these models read token ids and give hidden states of hidden_size.
    @property
    def input_kind(self) -> str:
        return "tokens"

    @property
    def vocab_size(self) -> int:
        return self.common.vocab_size

    @property
    def input_dim(self) -> None:
        return None

    @property
    def d_model(self) -> int:
        return self.common.hidden_size

    @property
    def n_layers(self) -> int:
        return self.common.num_layers


def standard_common(r: ConfigReader) -> CommonConfig:
    """fla's shared config keys (the default of a family module's `parse_common`)."""
    default_layers = 21 if r.family == "gated_deltanet" else 24
    hidden = r.get("hidden_size", 2048, "pos_int")
    layers = r.get("num_hidden_layers", default_layers, "pos_int")
    vocab = r.get("vocab_size", 32000, "pos_int")
    eps = r.get("norm_eps", 1e-6, "pos_float")
    ratio = r.get("hidden_ratio", 2 if r.family == "retnet" else 4, "pos_float?")
    inter = r.get("intermediate_size", None, "pos_int?")
    if inter is None:  # fla.modules.GatedMLP: 2/3 of hidden · ratio, up to a multiple of 256
        n = int(hidden * (4 if ratio is None else ratio) * 2 / 3)
        inter = 256 * ((n + 255) // 256)
    act = r.get("hidden_act", "swish", "str")
    r.require("hidden_act", act, ("swish",), "the MLP runs SwiGLU (fla's 'swish') only")
    refuse_hybrid(r)
    attnres = r.get("attnres_block_size", None, "int?")
    if attnres is not None:
        r.refuse("attnres_block_size", attnres, "attention residuals are not implemented")
    r.get("fuse_norm", True, "bool")  # fused or torch RMSNorm: the same function
    return CommonConfig(r.family, hidden, layers, vocab, eps, int(inter))


def refuse_hybrid(r: ConfigReader) -> None:
    """Read fla's `attn` key: refused when it places softmax-attention layers (hybrid models)."""
    raw_attn = r.raw.get("attn")
    r.read.add("attn")
    if raw_attn is not None:
        specs = [raw_attn] if isinstance(raw_attn, dict) else raw_attn
        ok = isinstance(specs, list) and all(isinstance(s, dict) for s in specs)
        hybrid = [i for s in specs for i in (s.get("layers") or [])] if ok else []
        if not ok or hybrid:
            r.refuse(
                "attn",
                raw_attn,
                f"hybrid softmax-attention layers (at layers {hybrid}) do not "
                "run in a fixed-size state",
            )


def parse_config(raw: Any, *, source: str) -> FlaConfig:
    """The FlaConfig of a config.json object, or ModelFolderError naming the first problem."""
    if not isinstance(raw, dict):
        msg = f"{source}: config.json must hold a JSON object, got {type(raw).__name__}"
        raise ModelFolderError(msg)
    family = raw.get("model_type")
    if family not in FAMILIES:
        msg = (
            f"{source}: config.json has model_type {json.dumps(family)}; expected one of "
            f"{list(FAMILIES)} (the fla families this runtime runs)"
        )
        raise ModelFolderError(msg)
    r = ConfigReader(raw, source)
    module = importlib.import_module(f"{__package__}.{family}")
    common = getattr(module, "parse_common", standard_common)(r)
    layer = module.parse(r, common)
    r.check_all_read()
    return FlaConfig(common, layer)
