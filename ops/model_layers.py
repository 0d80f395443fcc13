"""The embedding model's layers for the runtime: weights laid out for x @ W, the update rule of
each layer's attention, and the forward of one chunk against an array namespace `xp`.

Each layer's q, k and v projections, and the gate and β logits its rule needs (one per head),
come out of one matrix product with a weight fused once at load: [d_model, 3·d_attn + extra].
From the logits, per head and token (x the layer's normalized input):

    gated, gated_delta    log α_t = logsigmoid(x W_a + b_a) / tau     (finite, <= 0)
    delta, gated_delta    β_t     = sigmoid(x W_b + b_b)              (in (0, 1])

both formed in float64 (β is kept at or above the smallest positive float64, since the rules
take β in (0, 1]; below that a token writes nothing either way).  `decay` takes its fixed
per-head γ from the config.  Attention is then `causal_linear_attention(rule=...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .attention_state import AttentionState
from .model_config import ModelConfig
from .model_weights import BETA_RULES, GATED_RULES

__all__ = ["Attend", "LayerRule", "forward_chunk"]

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_TINY = float(np.finfo(np.float64).tiny)


class LayerRule:
    """One layer's update rule: its name, fixed parameters, and which logit columns follow q,
    k and v in the fused projection (`n_gate`, `n_beta`: n_heads or 0 each)."""

    def __init__(self, config: ModelConfig, i: int) -> None:
        spec = config.layer_rule(i)
        self.rule: str = spec["rule"]
        self.normalize: bool = bool(spec.get("normalize", True))
        self.tau: float = float(spec.get("tau", 1.0))
        g = spec.get("gamma")
        self.gamma = None if g is None else np.asarray(g, dtype=np.float64)
        h = config.n_heads
        self.n_gate = h if self.rule in GATED_RULES else 0
        self.n_beta = h if self.rule in BETA_RULES else 0

    @property
    def additive(self) -> bool:
        return self.rule == "additive"

    def kwargs(self, logits: np.ndarray | None) -> dict[str, Any]:
        """`causal_linear_attention` keyword arguments for this rule (host arrays only) from the
        chunk's logit columns [T, n_gate + n_beta] (None when the rule has none)."""
        if self.additive:
            return {}
        out: dict[str, Any] = {"rule": self.rule}
        if self.rule in ("decay", "gated"):
            out["normalize"] = self.normalize
        if self.gamma is not None:
            out["gamma"] = self.gamma
        if logits is None:
            return out
        x = np.asarray(logits, dtype=np.float64)
        if self.n_gate:
            a = x[:, : self.n_gate]
            # logsigmoid(a) = min(a, 0) - log1p(exp(-|a|)): no overflow, always <= 0
            out["log_alpha"] = (np.minimum(a, 0.0) - np.log1p(np.exp(-np.abs(a)))) / self.tau
        if self.n_beta:
            b = x[:, self.n_gate :]
            e = np.exp(-np.abs(b))
            sig = np.where(b >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
            out["beta"] = np.maximum(sig, _TINY)
        return out


class _Layer:
    """One block's weights, laid out for x @ W products (transposed once at load).

    Host NumPy arrays as built here; `map` gives the same layer on a device."""

    w_qkv: Any
    b_extra: Any
    w_o: Any
    w_up: Any
    b_up: Any
    w_down: Any
    b_down: Any
    n1: tuple[Any, Any]
    n2: tuple[Any, Any]
    rule: LayerRule

    def __init__(
        self, w: Mapping[str, np.ndarray], p: str, dt: np.dtype, layernorm: bool, rule: LayerRule
    ) -> None:
        def t(name: str) -> np.ndarray:
            return np.ascontiguousarray(w[f"{p}.{name}"].T, dtype=dt)

        def v(name: str) -> np.ndarray | None:
            key = f"{p}.{name}"
            return np.asarray(w[key], dtype=dt) if key in w else None

        self.rule = rule
        extra = ["gate"] * bool(rule.n_gate) + ["beta"] * bool(rule.n_beta)
        # q, k, v and the rule's logits in one product: [d_model, 3·d_attn + extra].
        cols = [t(f"attn.{n}.weight") for n in ("q", "k", "v", *extra)]
        self.w_qkv = np.ascontiguousarray(np.concatenate(cols, axis=1))
        biases = [w[f"{p}.attn.{n}.bias"] for n in extra]
        self.b_extra = np.concatenate(biases).astype(dt) if biases else None
        self.w_o = t("attn.o.weight")
        self.w_up = t("ff.up.weight")
        self.b_up = v("ff.up.bias")
        self.w_down = t("ff.down.weight")
        self.b_down = v("ff.down.bias")
        self.n1 = (v("norm1.weight"), v("norm1.bias") if layernorm else None)
        self.n2 = (v("norm2.weight"), v("norm2.bias") if layernorm else None)

    def map(self, fn: Callable[[Any], Any]) -> _Layer:
        """The same layer with every array passed through fn (e.g. copied to a device)."""
        new = object.__new__(_Layer)
        new.rule = self.rule
        new.w_qkv, new.b_extra, new.w_o = fn(self.w_qkv), _opt(fn, self.b_extra), fn(self.w_o)
        new.w_up, new.b_up = fn(self.w_up), _opt(fn, self.b_up)
        new.w_down, new.b_down = fn(self.w_down), _opt(fn, self.b_down)
        new.n1 = (_opt(fn, self.n1[0]), _opt(fn, self.n1[1]))
        new.n2 = (_opt(fn, self.n2[0]), _opt(fn, self.n2[1]))
        return new


def _opt(fn: Callable[[Any], Any], a: Any) -> Any:
    return None if a is None else fn(a)


class _Weights:
    """Every array the forward reads, in compute dtype: the model's host NumPy arrays, or one
    device's copies of them (`map`)."""

    def __init__(
        self,
        dtype: np.dtype,
        embed: Any,
        w_in: Any,
        b_in: Any,
        layers: list[_Layer],
        final: tuple[Any, Any],
    ) -> None:
        self.dtype = dtype
        self.embed = embed  # [vocab, d_model] (tokens) or None
        self.w_in = w_in  # [input_dim, d_model] (features) or None
        self.b_in = b_in
        self.layers = layers
        self.final = final

    @classmethod
    def build(cls, config: ModelConfig, stored: Mapping[str, np.ndarray], dt: np.dtype) -> _Weights:
        """The host layout of a model's stored (checked) tensors in compute dtype dt."""
        layernorm = config.normalization == "layernorm"
        if config.input_kind == "tokens":
            embed: np.ndarray | None = np.asarray(stored["embed.weight"], dtype=dt)
            w_in = b_in = None
        else:
            embed = None
            w_in = np.ascontiguousarray(stored["input_proj.weight"].T, dtype=dt)
            b_in = np.asarray(stored["input_proj.bias"], dtype=dt)
        layers = [
            _Layer(stored, f"layers.{i}", dt, layernorm, LayerRule(config, i))
            for i in range(config.n_layers)
        ]
        final = (
            np.asarray(stored["final_norm.weight"], dtype=dt),
            np.asarray(stored["final_norm.bias"], dtype=dt) if layernorm else None,
        )
        return cls(dt, embed, w_in, b_in, layers, final)

    def map(self, fn: Callable[[Any], Any]) -> _Weights:
        return _Weights(
            self.dtype,
            _opt(fn, self.embed),
            _opt(fn, self.w_in),
            _opt(fn, self.b_in),
            [layer.map(fn) for layer in self.layers],
            (_opt(fn, self.final[0]), _opt(fn, self.final[1])),
        )


# -- the forward, against an array namespace ---------------------------------------------------
Attend = Callable[[Any, Any, Any, AttentionState, dict[str, Any]], tuple[Any, AttentionState]]


def _norm(xp: Any, x: Any, wb: tuple[Any, Any], eps: float) -> Any:
    w, b = wb
    if b is not None:  # layernorm: (x - mean) / sqrt(var + eps) · w + b
        y = x - x.mean(axis=1, keepdims=True)
        var = xp.einsum("td,td->t", y, y) / x.shape[1]
    else:  # rmsnorm: x / sqrt(mean(x²) + eps) · w
        y = x.copy()
        var = xp.einsum("td,td->t", x, x) / x.shape[1]
    y *= (1.0 / xp.sqrt(var + eps))[:, None].astype(x.dtype, copy=False)
    y *= w
    if b is not None:
        y += b
    return y


def _activation(xp: Any, u: Any, act: str) -> Any:
    """In place on u (a fresh buffer)."""
    if act == "relu":
        return xp.maximum(u, 0, out=u)
    if act == "silu":  # x · sigmoid(x), sigmoid(x) = (1 + tanh(x/2)) / 2 (no overflow)
        s = xp.tanh(u * 0.5)
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
    xp.tanh(s, out=s)
    s += 1.0
    u *= 0.5
    u *= s
    return u


def forward_chunk(
    xp: Any,
    w: _Weights,
    x_in: Any,
    states: Sequence[AttentionState],
    *,
    config: ModelConfig,
    attend: Attend,
    activate: Callable[[Any, str], Any] | None = None,
) -> tuple[Any, list[AttentionState]]:
    """One chunk through the model with the array namespace xp (numpy, or cupy on a device).

    x_in: checked token ids [T] or feature vectors [T, input_dim]; w, states: arrays of xp;
    attend(q, k, v, state, rule_kwargs) -> (out [T, H, d_head], new state), arrays of xp, with
    rule_kwargs the layer's `LayerRule.kwargs` ({} for an additive layer; the logits are only
    formed, on the host, for the others); activate(u, name):
    the feed-forward activation in place on a fresh buffer (default: `_activation` with xp).
    Returns (emb [T, d_model] in w.dtype, new states), arrays of xp: nothing here copies
    between the host and a device, so on a device every layer's activations stay there.
    """
    c = config
    if w.embed is not None:
        x = w.embed[x_in]
    else:
        x = x_in.astype(w.dtype, copy=False) @ w.w_in
        x += w.b_in
    t = x.shape[0]
    h, dh, a = c.n_heads, c.d_head, c.d_attn
    new_states = []
    for layer, s in zip(w.layers, states, strict=True):
        proj = _norm(xp, x, layer.n1, c.norm_eps) @ layer.w_qkv  # [T, 3·d_attn + extra]
        qkv = proj[:, : 3 * a].reshape(t, 3, h, dh)
        logits = None
        if layer.b_extra is not None:
            logits = proj[:, 3 * a :] + layer.b_extra
        y, s_new = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2], s, layer.rule.kwargs(logits))
        new_states.append(s_new)
        x += y.reshape(t, a) @ layer.w_o
        u = _norm(xp, x, layer.n2, c.norm_eps) @ layer.w_up
        if layer.b_up is not None:
            u += layer.b_up
        u = _activation(xp, u, c.activation) if activate is None else activate(u, c.activation)
        x += u @ layer.w_down
        if layer.b_down is not None:
            x += layer.b_down
    return _norm(xp, x, w.final, c.norm_eps), new_states
