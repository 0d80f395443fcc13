"""DeltaNet (model_type "delta_net"; fla.layers.delta_net.DeltaNet), per chunk.

With K = hidden·expand_k, V = hidden·expand_v and H heads of d_k = K/H, d_v = V/H:

    q, k = q_proj x, k_proj x through their short convs (SiLU inside when qk_activation is
           'silu', else the activation — relu, elu+1 or identity — after the conv)
    v    = silu(conv(v_proj x))                     (without convs: silu of the projections)
    q, k L2-normalized, x / sqrt(Σx² + 1e-6) (qk_norm 'l2'), or divided by Σ|x| ('sum')
    β    = sigmoid(b_proj x) (1 without use_beta), × 2 with allow_neg_eigval
    S_t = S_{t-1} + β_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ,  o_t = S_tᵀ (q_t d_k^-0.5)   (the delta kernel)
    o = RMSNorm per head (· silu(g_proj x) with use_gate) ; out = o_proj o

fla 0.6.0 accepts `use_output_norm` but always applies the output norm; a config turning it off
is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import CommonConfig, ConfigReader
from .dense import Weights
from .families import ConvSet, row_major
from .state import LayerState, StateSpec

__all__ = ["DeltaNetSpec", "attn_tensors", "build", "parse"]


QK_ACTIVATIONS = ("silu", "relu", "elu", "identity")
QK_NORMS = ("l2", "sum")


@dataclass(frozen=True)
class DeltaNetSpec:
    num_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_size: int
    use_beta: bool
    allow_neg_eigval: bool
    use_gate: bool
    qk_activation: str
    qk_norm: str


def parse(r: ConfigReader, c: CommonConfig) -> DeltaNetSpec:
    h = r.get("num_heads", 16, "pos_int")
    ek = r.get("expand_k", 1.0, "pos_float")
    ev = r.get("expand_v", 1.0, "pos_float")
    conv = r.get("use_short_conv", True, "bool")
    width = r.get("conv_size", 4, "pos_int")
    act = r.get("qk_activation", "silu", "str")
    r.require("qk_activation", act, QK_ACTIVATIONS, f"fla 0.6.0 has {list(QK_ACTIVATIONS)}")
    norm = r.get("qk_norm", "l2", "str")
    r.require("qk_norm", norm, QK_NORMS, f"fla 0.6.0 has {list(QK_NORMS)}")
    r.require(
        "attn_mode",
        r.get("attn_mode", "chunk", "str"),
        ("chunk", "fused_recurrent"),
        "not a DeltaNet mode of fla 0.6.0",
    )
    r.only_default(
        "use_output_norm",
        True,
        "fla 0.6.0 applies the output norm whatever this "
        "says, so the checkpoint cannot run as trained",
    )
    key_dim, value_dim = c.hidden_size * ek, c.hidden_size * ev
    for name, ratio, dim in (("expand_k", ek, key_dim), ("expand_v", ev, value_dim)):
        if dim != round(dim) or round(dim) % h:
            r.refuse(
                name,
                ratio,
                f"hidden_size · {name} = {dim} must be an integer divisible by num_heads ({h})",
            )
    return DeltaNetSpec(
        num_heads=h,
        head_k_dim=round(key_dim) // h,
        head_v_dim=round(value_dim) // h,
        conv_size=width if conv else 0,
        use_beta=r.get("use_beta", True, "bool"),
        allow_neg_eigval=r.get("allow_neg_eigval", False, "bool"),
        use_gate=r.get("use_gate", False, "bool"),
        qk_activation=act,
        qk_norm=norm,
    )


def attn_tensors(s: DeltaNetSpec, c: CommonConfig) -> dict[str, tuple[int, ...]]:
    k, v = s.num_heads * s.head_k_dim, s.num_heads * s.head_v_dim
    out: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (k, c.hidden_size),
        "k_proj.weight": (k, c.hidden_size),
        "v_proj.weight": (v, c.hidden_size),
        "o_norm.weight": (s.head_v_dim,),
        "o_proj.weight": (c.hidden_size, v),
    }
    if s.use_beta:
        out["b_proj.weight"] = (s.num_heads, c.hidden_size)
    if s.use_gate:
        out["g_proj.weight"] = (v, c.hidden_size)
    if s.conv_size:
        for n, d in (("q", k), ("k", k), ("v", v)):
            out[f"{n}_conv1d.weight"] = (d, 1, s.conv_size)
    return out


class DeltaNetMixer:
    def __init__(self, s: DeltaNetSpec, c: CommonConfig, w: Mapping[str, Any], weights: Weights):
        self.s, self.eps, self.ops = s, c.norm_eps, weights.ops
        names = ["q", "k", "v"] + ["b"] * s.use_beta + ["g"] * s.use_gate
        self.proj = weights.fused([(n, w[f"{n}_proj.weight"]) for n in names])
        self.o_proj = weights.dense(w["o_proj.weight"])
        self.norm_w = weights.array(w["o_norm.weight"])
        convs = {n: w[f"{n}_conv1d.weight"] for n in "qkv"} if s.conv_size else {}
        qk_silu = {"q", "k"} if s.qk_activation == "silu" else set()
        self.conv = ConvSet(convs, qk_silu | {"v"}, weights)
        h, dk, dv = s.num_heads, s.head_k_dim, s.head_v_dim
        self.state_spec = StateSpec((("S", (h, dk, dv)), *self.conv.state_shapes()))

    def forward(self, x: np.ndarray, st: LayerState) -> tuple[np.ndarray, LayerState]:
        s, ops = self.s, self.ops
        xp = ops.xp
        t = x.shape[0]
        p = self.proj(x)
        new: dict[str, Any] = {}
        dk, dv = s.head_k_dim, s.head_v_dim
        scale = dk**-0.5
        l2 = s.qk_activation == "silu" and s.qk_norm == "l2"  # the default: one pass each
        if s.conv_size:  # each convolution writes its heads (and L2-normalizes q and k)
            qh = self.conv("q", p["q"], st, new, dk, scale if l2 else None)
            kh = self.conv("k", p["k"], st, new, dk, 1.0 if l2 else None)
            vh = self.conv("v", p["v"], st, new, dv)
        else:
            q, k = p["q"], p["k"]
            if s.qk_activation == "silu":
                q, k = ops.silu(q), ops.silu(k)
            if l2:
                qh, kh = ops.l2_heads(q, dk, scale), ops.l2_heads(k, dk)
            else:
                qh, kh = ops.head_major(q, dk), ops.head_major(k, dk)
            vh = ops.head_major(ops.silu(p["v"]), dv)
        if not l2:
            if s.qk_activation != "silu":
                act = s.qk_activation
                qh, kh = ops.activation(act, qh), ops.activation(act, kh)
            norm = ops.l2_norm if s.qk_norm == "l2" else ops.sum_norm
            qh, kh = norm(qh), norm(kh)
            qh *= x.dtype.type(scale)
        beta = ops.sigmoid(p["b"].astype(np.float64)) if s.use_beta else xp.ones((t, s.num_heads))
        if s.allow_neg_eigval:
            beta = beta * 2.0
        state = ops.copy(st["S"])
        o = ops.delta_chunks(
            qh,
            kh,
            vh,
            state,
            xp.zeros((s.num_heads, t)),
            xp.ascontiguousarray(beta.T),
        )
        o = row_major(o)
        gate = p["g"].reshape(o.shape) if s.use_gate else None
        o = ops.head_norm(o, self.norm_w, self.eps, gate, "swish")
        return self.o_proj(o.reshape(t, -1)), ops.state({"S": state, **new})


def build(
    s: DeltaNetSpec,
    c: CommonConfig,
    w: Mapping[str, Any],
    weights: Weights,
    index: int,
    model: Mapping[str, Any],
) -> DeltaNetMixer:
    return DeltaNetMixer(s, c, w, weights)
