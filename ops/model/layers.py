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
from typing import Any, Protocol

import numpy as np
from linstream.ops.attention_state import AttentionState

from .config import ModelConfig
from .weights import BETA_RULES, GATED_RULES

__all__ = ["Attend", "LayerRule", "Ops", "RowSplit", "XpOps", "forward_chunk"]

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
# The largest layer-0 projection table a token model keeps (vocab × (3·d_attn + extra) in the
# compute dtype; builtin:default's is 6 MiB); a larger vocabulary projects per chunk.
_QKV0_MAX_BYTES = 64 << 20
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
        # A token model's first projection, norm1(embed[id]) @ w_qkv of layer 0, per token id
        # [vocab, 3·d_attn + extra] (see `with_qkv0`), or None: then it is computed per chunk.
        self.qkv0: Any = None

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
        return cls(dt, embed, w_in, b_in, layers, final).with_qkv0(config)

    def with_qkv0(self, config: ModelConfig) -> _Weights:
        """Self with `qkv0` filled in for a float32 token model whose table fits
        _QKV0_MAX_BYTES.

        Layer 0's fused projection of a token depends on its id only, so the runtime looks it
        up instead of forming the first norm and product per chunk (an eighth of the model's
        products).  The table is formed in float64 and rounded once to float32.  Float64
        compute (the reference mode the tests compare with the twin) forms every step."""
        if self.embed is None or self.dtype != np.float32:
            return self
        layer = self.layers[0]
        rows, cols = self.embed.shape[0], layer.w_qkv.shape[1]
        if rows * cols * self.dtype.itemsize > _QKV0_MAX_BYTES:
            return self
        # the stored tensors are float32, so their compute-dtype copies widen to them exactly
        f8 = np.float64
        n1 = tuple(None if a is None else np.asarray(a, f8) for a in layer.n1)
        x = _norm(np, np.asarray(self.embed, f8), (n1[0], n1[1]), config.norm_eps)
        self.qkv0 = np.ascontiguousarray(x @ np.asarray(layer.w_qkv, f8), dtype=self.dtype)
        self.qkv0.setflags(write=False)
        return self

    def without_qkv0(self) -> _Weights:
        """The same weights without the derived table (what a pickled model carries)."""
        new = object.__new__(_Weights)
        new.__dict__.update(self.__dict__)
        new.qkv0 = None
        return new

    def map(self, fn: Callable[[Any], Any]) -> _Weights:
        """The same weights with every array passed through fn (e.g. copied to a device),
        without `qkv0`: a device forms layer 0's product itself, and the upload stays the
        model's own tensors."""
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


class Ops(Protocol):
    """The per-token steps of the forward (`XpOps` here; `model_kernels.NumbaOps` fuses them)."""

    def norm(self, x: Any, wb: tuple[Any, Any]) -> Any: ...

    def add_norm(self, x: Any, r: Any, bias: Any, wb: tuple[Any, Any]) -> Any: ...

    def bias_act(self, u: Any, bias: Any, act: str) -> Any: ...


class XpOps:
    """The per-token steps with array-namespace operations (NumPy or CuPy, any float dtype)."""

    def __init__(
        self, xp: Any, norm_eps: float, activate: Callable[[Any, str], Any] | None = None
    ) -> None:
        self.xp = xp
        self.eps = float(norm_eps)
        self.activate = activate

    def norm(self, x: Any, wb: tuple[Any, Any]) -> Any:
        """norm(x) (layernorm when wb has a bias, else rmsnorm), a new array."""
        return _norm(self.xp, x, wb, self.eps)

    def add_norm(self, x: Any, r: Any, bias: Any, wb: tuple[Any, Any]) -> Any:
        """x += r (+ bias) in place; returns norm(x), a new array."""
        x += r
        if bias is not None:
            x += bias
        return _norm(self.xp, x, wb, self.eps)

    def bias_act(self, u: Any, bias: Any, act: str) -> Any:
        """act(u + bias) in place on u (a fresh buffer)."""
        if bias is not None:
            u += bias
        return _activation(self.xp, u, act) if self.activate is None else self.activate(u, act)


# split(fn, t): calls fn(rows) for slices `rows` that partition range(t), perhaps on threads
RowSplit = Callable[[Callable[[slice], None], int], None]


def forward_chunk(
    xp: Any,
    w: _Weights,
    x_in: Any,
    states: Sequence[AttentionState],
    *,
    config: ModelConfig,
    attend: Attend,
    activate: Callable[[Any, str], Any] | None = None,
    ops: Ops | None = None,
    split: RowSplit | None = None,
) -> tuple[Any, list[AttentionState]]:
    """One chunk through the model with the array namespace xp (numpy, or cupy on a device).

    x_in: checked token ids [T] or feature vectors [T, input_dim]; w, states: arrays of xp;
    attend(q, k, v, state, rule_kwargs) -> (out [T, H, d_head], new state), arrays of xp, with
    rule_kwargs the layer's `LayerRule.kwargs` ({} for an additive layer; the logits are only
    formed, on the host, for the others); ops: the per-token steps (default `XpOps(xp)`, with
    activate(u, name) as its activation in place on a fresh buffer when given); split: runs
    the per-token work between two attention calls over row ranges (`model_threads`), else
    one range.  Returns (emb [T, d_model] in w.dtype, new states), arrays of xp: nothing here
    copies between the host and a device, so on a device every layer's activations stay there.

    Each layer's residual add is fused with the norm that follows it (the next layer's first
    norm, or the final one); a token model's first projection is a row of `w.qkv0`.
    """
    c = config
    ops = XpOps(xp, c.norm_eps, activate) if ops is None else ops
    if w.embed is not None:
        x = w.embed[x_in]
    else:
        x = x_in.astype(w.dtype, copy=False) @ w.w_in
        x += w.b_in
    t = x.shape[0]
    h, dh, a = c.n_heads, c.d_head, c.d_attn
    layers = w.layers
    proj = w.qkv0[x_in] if w.qkv0 is not None else ops.norm(x, layers[0].n1) @ layers[0].w_qkv
    new_states = []
    for i, (layer, s) in enumerate(zip(layers, states, strict=True)):
        # proj: [T, 3·d_attn + extra], this layer's fused projection
        qkv = proj[:, : 3 * a].reshape(t, 3, h, dh)
        logits = None
        if layer.b_extra is not None:
            logits = proj[:, 3 * a :] + layer.b_extra
        y, s_new = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2], s, layer.rule.kwargs(logits))
        new_states.append(s_new)
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        y2 = y.reshape(t, a)

        def rest(rows: slice, layer: _Layer = layer, nxt: _Layer | None = nxt, y2: Any = y2) -> Any:
            """The layer after attention, for these rows: the next layer's projection of them
            (or their embeddings after the last layer)."""
            xr = x[rows]
            xn = ops.add_norm(xr, y2[rows] @ layer.w_o, None, layer.n2)
            u = ops.bias_act(xn @ layer.w_up, layer.b_up, c.activation)
            xn = ops.add_norm(
                xr, u @ layer.w_down, layer.b_down, w.final if nxt is None else nxt.n1
            )
            return xn if nxt is None else xn @ nxt.w_qkv

        if split is None:
            proj = rest(slice(0, t))
        else:
            width = c.d_model if nxt is None else nxt.w_qkv.shape[1]
            out = xp.empty((t, width), dtype=w.dtype)

            def into(rows: slice, out: Any = out, rest: Callable[[slice], Any] = rest) -> None:
                out[rows] = rest(rows)

            split(into, t)
            proj = out
    return proj, new_states
