"""The embedding model's configuration: a frozen dataclass that round-trips through JSON.

The model is a stack of pre-norm residual blocks over a d_model-wide stream:

    x = embed[tokens]                    (input_kind "tokens": an embedding table [vocab, d_model])
    x = features @ W_in + b_in           (input_kind "features": a projection [input_dim → d_model])
    for each layer:
        x = x + o(causal_linear_attention(q(n1(x)), k(n1(x)), v(n1(x))))   n_heads × d_head
        x = x + down(act(up(n2(x))))                                        d_ff wide
    embeddings = final_norm(x)

There is no positional encoding: causal linear attention carries order in its running sums, and a
position table would put a bound on an unbounded sequence.  The same JSON is stored in a weights
file's metadata, so a file describes its own architecture.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from .feature_maps import get_feature_map

__all__ = ["ACTIVATIONS", "INPUT_KINDS", "NORMALIZATIONS", "ModelConfig"]

INPUT_KINDS = ("tokens", "features")
NORMALIZATIONS = ("layernorm", "rmsnorm")
# "gelu_tanh" is GELU with the tanh approximation (torch: gelu(approximate="tanh")).
ACTIVATIONS = ("gelu_tanh", "relu", "silu")
# Sizes beyond these are refused before anything is allocated: a config comes from an untrusted
# file, and a 10^12-wide layer must fail with a message, not with the machine out of memory.
_MAX_DIM = 1 << 20
_MAX_LAYERS = 1024


def _positive_int(name: str, value: Any, limit: int = _MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"ModelConfig.{name} must be an integer, got {value!r} ({type(value).__name__})"
        raise TypeError(msg)
    if not 1 <= value <= limit:
        msg = f"ModelConfig.{name} must be between 1 and {limit}, got {value}"
        raise ValueError(msg)
    return value


def _finite_nonneg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"ModelConfig.{name} must be a number, got {value!r} ({type(value).__name__})"
        raise TypeError(msg)
    v = float(value)
    if not math.isfinite(v) or v < 0:
        msg = f"ModelConfig.{name} must be a finite number >= 0, got {value!r}"
        raise ValueError(msg)
    return v


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of the embedding model (see the module docstring for the forward pass).

    input_kind: "tokens" (then vocab_size is set, input_dim is None) or "features" (then
    input_dim is set, vocab_size is None).  feature_map is a feature-map config dict such as
    {"name": "elu+1"} or {"name": "favor+", "num_features": 64, "seed": 0}; eps is the attention
    denominator's eps; norm_eps the normalization's.  Use `to_json`/`from_json` to store it.
    """

    input_kind: str = "tokens"
    vocab_size: int | None = 4096
    input_dim: int | None = None
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_head: int = 32
    d_ff: int = 512
    feature_map: dict[str, Any] = dataclasses.field(default_factory=lambda: {"name": "elu+1"})
    eps: float = 1e-6
    normalization: str = "layernorm"
    norm_eps: float = 1e-5
    activation: str = "gelu_tanh"

    def __post_init__(self) -> None:
        if self.input_kind not in INPUT_KINDS:
            msg = f"ModelConfig.input_kind must be one of {INPUT_KINDS}, got {self.input_kind!r}"
            raise ValueError(msg)
        if self.input_kind == "tokens":
            _positive_int("vocab_size", self.vocab_size, limit=1 << 26)
            if self.input_dim is not None:
                msg = (
                    "ModelConfig.input_dim must be None when input_kind is 'tokens' "
                    f"(got {self.input_dim!r}); set input_kind='features' for feature vectors"
                )
                raise ValueError(msg)
        else:
            _positive_int("input_dim", self.input_dim)
            if self.vocab_size is not None:
                msg = (
                    "ModelConfig.vocab_size must be None when input_kind is 'features' "
                    f"(got {self.vocab_size!r}); set input_kind='tokens' for token ids"
                )
                raise ValueError(msg)
        for name in ("d_model", "n_heads", "d_head", "d_ff"):
            _positive_int(name, getattr(self, name))
        _positive_int("n_layers", self.n_layers, limit=_MAX_LAYERS)
        # Stored as floats so that eps=0 and eps=0.0 write the same JSON (and fingerprint).
        object.__setattr__(self, "eps", _finite_nonneg("eps", self.eps))
        object.__setattr__(self, "norm_eps", _finite_nonneg("norm_eps", self.norm_eps))
        if self.normalization not in NORMALIZATIONS:
            msg = (
                f"ModelConfig.normalization must be one of {NORMALIZATIONS}, "
                f"got {self.normalization!r}"
            )
            raise ValueError(msg)
        if self.activation not in ACTIVATIONS:
            msg = f"ModelConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}"
            raise ValueError(msg)
        if not isinstance(self.feature_map, dict) or "name" not in self.feature_map:
            msg = (
                "ModelConfig.feature_map must be a feature-map config dict with a 'name', "
                f"e.g. {{'name': 'elu+1'}}, got {self.feature_map!r}"
            )
            raise TypeError(msg)
        # A frozen copy: the caller's dict may change later, this config must not.
        object.__setattr__(self, "feature_map", json.loads(json.dumps(self.feature_map)))
        fm = get_feature_map(self.feature_map)  # raises ValueError for an unknown map
        f = _positive_int("feature map output width", fm.out_dim(self.d_head))
        if f * self.d_head > _MAX_DIM * 64:
            msg = (
                f"feature map {self.feature_map} gives {f} features per {self.d_head}-wide head; "
                f"F·d_head must stay <= {_MAX_DIM * 64}"
            )
            raise ValueError(msg)

    def __hash__(self) -> int:
        return hash(self.to_json())

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def d_attn(self) -> int:
        """Width of the concatenated heads, n_heads · d_head."""
        return self.n_heads * self.d_head

    @property
    def feature_dim(self) -> int:
        """F: the feature map's output width for a d_head-wide query or key."""
        return int(get_feature_map(self.feature_map).out_dim(self.d_head))

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces (the fingerprint hashes this text)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any) -> ModelConfig:
        if not isinstance(data, dict):
            msg = f"a model config must be a JSON object, got {type(data).__name__}"
            raise TypeError(msg)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            msg = f"unknown model config field(s) {unknown}; known fields are {sorted(known)}"
            raise ValueError(msg)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as ex:
            msg = f"model config is not valid JSON: {ex}"
            raise ValueError(msg) from ex
        return cls.from_dict(data)
