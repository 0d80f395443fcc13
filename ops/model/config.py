"""The embedding model's configuration: a frozen dataclass that round-trips through JSON.

The model is a stack of pre-norm residual blocks over a d_model-wide stream:

    x = embed[tokens]                    (input_kind "tokens": an embedding table [vocab, d_model])
    x = features @ W_in + b_in           (input_kind "features": a projection [input_dim → d_model])
    for each layer:
        x = x + o(causal_linear_attention(q(n1(x)), k(n1(x)), v(n1(x))))   n_heads × d_head
        x = x + down(act(up(n2(x))))                                        d_ff wide
    embeddings = final_norm(x)

Each layer's attention uses one update rule of the carried state (`rules`, default all
"additive"; see docs/rules.md and `RULE_DEFAULTS`):

    additive      S ← S + φ(k)vᵀ                                   (no parameters)
    decay         S ← γ_h S + φ(k)vᵀ          gamma: n_heads values in (0, 1) (RetNet's
                                              1 - 2^(-5-h) by default), normalize
    gated         S ← α_t S + φ(k)vᵀ          log α_t = logsigmoid(x W_a + b_a) / tau per head
                                              (weights attn.gate.*), normalize
    delta         S ← S + β_t k(v - Sᵀk)ᵀ     β_t = sigmoid(x W_b + b_b) per head (attn.beta.*),
                                              k = φ(k)/‖φ(k)‖
    gated_delta   S ← α_t(I - β_t kkᵀ)S + β_t kvᵀ      both projections

x is the layer's normalized input n1(x).  A config whose layers are all additive writes the JSON
it wrote before rules existed (the field is left out), so its fingerprint is unchanged.

There is no positional encoding: causal linear attention carries order in its running sums, and a
position table would put a bound on an unbounded sequence.  The same JSON is stored in a weights
file's metadata, so a file describes its own architecture.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from linstream.ops.feature_maps import get_feature_map

__all__ = [
    "ACTIVATIONS",
    "INPUT_KINDS",
    "MODEL_RULES",
    "NORMALIZATIONS",
    "RULE_DEFAULTS",
    "ModelConfig",
    "retnet_gammas",
]

INPUT_KINDS = ("tokens", "features")
NORMALIZATIONS = ("layernorm", "rmsnorm")
# "gelu_tanh" is GELU with the tanh approximation (torch: gelu(approximate="tanh")).
ACTIVATIONS = ("gelu_tanh", "relu", "silu")
# Sizes beyond these are refused before anything is allocated: a config comes from an untrusted
# file, and a 10^12-wide layer must fail with a message, not with the machine out of memory.
_MAX_DIM = 1 << 20
_MAX_LAYERS = 1024
# The rules a layer may use (the names of linstream.ops.rules) and the keys each one takes,
# with their defaults (gamma None: `retnet_gammas(n_heads)`).  GLA divides its log-sigmoid gate
# by a temperature of 16 so that a fresh layer forgets slowly; that is the default tau here.
MODEL_RULES = ("additive", "decay", "gated", "delta", "gated_delta")
RULE_DEFAULTS: dict[str, dict[str, Any]] = {
    "additive": {},
    "decay": {"gamma": None, "normalize": True},
    "gated": {"normalize": True, "tau": 16.0},
    "delta": {},
    "gated_delta": {"tau": 16.0},
}


def retnet_gammas(n_heads: int) -> list[float]:
    """RetNet's per-head decays γ_h = 1 - 2^(-5-h), h = 0..n_heads-1 (time scales 32, 64, ...)."""
    return [1.0 - 2.0 ** (-5 - h) for h in range(n_heads)]


def _layer_rule(i: int, spec: Any, n_heads: int) -> dict[str, Any]:
    """One layer's rule in canonical form: every key the rule takes, defaults filled in."""
    where = f"ModelConfig.rules[{i}] (layer {i})"
    if isinstance(spec, str):
        spec = {"rule": spec}
    if not isinstance(spec, dict) or "rule" not in spec:
        msg = (
            f"{where} must be a rule name or a dict with a 'rule', e.g. {{'rule': 'decay'}}, "
            f"got {spec!r}"
        )
        raise TypeError(msg)
    name = spec["rule"]
    if name not in MODEL_RULES:
        msg = f"{where}: unknown rule {name!r}; expected one of {list(MODEL_RULES)}"
        raise ValueError(msg)
    defaults = RULE_DEFAULTS[name]
    unknown = sorted(set(spec) - {"rule", *defaults})
    if unknown:
        msg = f"{where}: rule {name!r} takes {sorted(defaults)}, got unknown key(s) {unknown}"
        raise ValueError(msg)
    out: dict[str, Any] = {"rule": name}
    for key, default in defaults.items():
        value = spec.get(key, default)
        if key == "normalize":
            if not isinstance(value, bool):
                msg = f"{where}: normalize must be true or false, got {value!r}"
                raise TypeError(msg)
        elif key == "tau":
            number = not isinstance(value, bool) and isinstance(value, (int, float))
            if not number or not math.isfinite(float(value)) or float(value) <= 0:
                msg = f"{where}: tau must be a finite number > 0, got {value!r}"
                raise (ValueError if number else TypeError)(msg)
            value = float(value)
        elif key == "gamma":
            value = _gammas(where, retnet_gammas(n_heads) if value is None else value, n_heads)
        out[key] = value
    return out


def _gammas(where: str, value: Any, n_heads: int) -> list[float]:
    if not isinstance(value, (list, tuple)) or len(value) != n_heads:
        msg = (
            f"{where}: gamma must be a list of n_heads = {n_heads} decays in (0, 1), got {value!r}"
        )
        raise ValueError(msg)
    out = []
    for h, g in enumerate(value):
        ok = not isinstance(g, bool) and isinstance(g, (int, float))
        if not ok or not 0.0 < float(g) < 1.0:
            msg = f"{where}: gamma must lie in (0, 1) for every head, got {g!r} for head {h}"
            raise ValueError(msg)
        out.append(float(g))
    return out


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
    denominator's eps; norm_eps the normalization's.  rules: None (every layer additive) or one
    entry per layer, a rule name or a dict such as {"rule": "decay", "gamma": [...]} (see the
    module docstring); stored in canonical form (every key, defaults filled in), and as None
    when every layer is additive.  Use `to_json`/`from_json` to store it.
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
    rules: list[Any] | None = None

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

        object.__setattr__(self, "rules", self._canonical_rules())

    def _canonical_rules(self) -> list[dict[str, Any]] | None:
        if self.rules is None:
            return None
        if not isinstance(self.rules, (list, tuple)):
            msg = (
                "ModelConfig.rules must be None or a list with one rule per layer, got "
                f"{type(self.rules).__name__}"
            )
            raise TypeError(msg)
        if len(self.rules) != self.n_layers:
            msg = (
                f"ModelConfig.rules must hold one rule per layer (n_layers = {self.n_layers}), "
                f"got {len(self.rules)}"
            )
            raise ValueError(msg)
        rules = [_layer_rule(i, r, self.n_heads) for i, r in enumerate(self.rules)]
        if all(r["rule"] == "additive" for r in rules):
            return None  # the default, written as before rules existed
        return rules

    def __hash__(self) -> int:
        return hash(self.to_json())

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def d_attn(self) -> int:
        """Width of the concatenated heads, n_heads · d_head."""
        return self.n_heads * self.d_head

    def layer_rule(self, i: int) -> dict[str, Any]:
        """Layer i's rule in canonical form, e.g. {"rule": "additive"} or {"rule": "gated",
        "normalize": True, "tau": 16.0} (a copy)."""
        if not 0 <= i < self.n_layers:
            msg = f"layer index must be in [0, {self.n_layers}), got {i}"
            raise IndexError(msg)
        if self.rules is None:
            return {"rule": "additive"}
        return json.loads(json.dumps(self.rules[i]))

    @property
    def feature_dim(self) -> int:
        """F: the feature map's output width for a d_head-wide query or key."""
        return int(get_feature_map(self.feature_map).out_dim(self.d_head))

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, except `rules` when it is the default (every layer additive)."""
        out = dataclasses.asdict(self)
        if out["rules"] is None:
            del out["rules"]
        return out

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
