"""Gated Linear Attention (model_type "gla"; fla.layers.gla.GatedLinearAttention), per chunk.

With K = hidden·expand_k, V = hidden·expand_v, H heads of d_k = K/H and d_v = V/H, and G query
heads per key/value head (num_kv_heads):

    q, k, v = q_proj x, k_proj x, v_proj x          (each through its short conv + SiLU if any)
    g       = logsigmoid(gk_proj.1(gk_proj.0(x))) / 16, at least clamp_min if set
                                                     (a low-rank gate per key dimension)
    k, v, g repeated so that query head h reads key/value head h // G; q, k through the
    feature map if one is set; q scaled by d_k^-0.5
    S_t = diag(e^{g_t}) S_{t-1} + k_t v_tᵀ,  o_t = S_tᵀ q_t          (the vector-gated kernel)
    o = RMSNorm per head (· silu(g_proj x) with the output gate) ; out = o_proj o

fla 0.6.0 hard-codes the gate's rank (16) and normalizer (16); `gate_logit_normalizer`,
`gate_low_rank_dim`, `use_gk` and `use_gv` are ignored by it, so other values are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import CommonConfig, ConfigReader
from .dense import Weights
from .families import ConvSet, row_major
from .state import LayerState, StateSpec

__all__ = ["GLASpec", "attn_tensors", "build", "parse"]


GATE_RANK = 16  # fla 0.6.0's GatedLinearAttention defaults, which its block never overrides
GATE_NORMALIZER = 16
FEATURE_MAPS = ("relu", "sigmoid", "silu", "swish")


@dataclass(frozen=True)
class GLASpec:
    num_heads: int
    kv_groups: int  # query heads per key/value head
    head_k_dim: int
    head_v_dim: int
    feature_map: str | None
    conv_size: int  # 0: no short convolutions
    output_gate: bool
    clamp_min: float | None
    norm_weight: bool  # elementwise_affine
    norm_name: str  # g_norm_swish_gate (fused norm and gate) or g_norm


def parse(r: ConfigReader, c: CommonConfig) -> GLASpec:
    h = r.get("num_heads", 4, "pos_int")
    kv = r.get("num_kv_heads", None, "pos_int?") or h
    ek = r.get("expand_k", 0.5, "pos_float")
    ev = r.get("expand_v", 1.0, "pos_float")
    fmap = r.get("feature_map", None, "str?")
    if fmap is not None:
        r.require("feature_map", fmap, FEATURE_MAPS, f"the runtime has {list(FEATURE_MAPS)}")
    conv = r.get("use_short_conv", False, "bool")
    width = r.get("conv_size", 4, "pos_int")
    gate = r.get("use_output_gate", True, "bool")
    clamp = r.get("clamp_min", None, "float?")
    affine = bool(r.get("elementwise_affine", True, "bool?"))
    fuse = r.get("fuse_norm", True, "bool")
    r.require(
        "attn_mode",
        r.get("attn_mode", "chunk", "str"),
        ("chunk", "fused_recurrent", "fused_chunk"),
        "not a GLA mode of fla 0.6.0",
    )
    why = "fla 0.6.0 ignores this key (its GLA layer hard-codes the value), so the checkpoint "
    r.only_default("gate_logit_normalizer", GATE_NORMALIZER, why + "cannot run as trained")
    r.only_default("gate_low_rank_dim", GATE_RANK, why + "cannot run as trained")
    r.only_default("use_gk", True, why + "cannot run as trained")
    r.only_default("use_gv", False, why + "cannot run as trained")
    key_dim, value_dim = c.hidden_size * ek, c.hidden_size * ev
    for name, ratio, dim in (("expand_k", ek, key_dim), ("expand_v", ev, value_dim)):
        if not math.isclose(dim, round(dim)) or round(dim) % h or round(dim) % kv:
            r.refuse(
                name,
                ratio,
                f"hidden_size · {name} = {dim} must be an "
                f"integer divisible by num_heads ({h}) and num_kv_heads ({kv})",
            )
    if h % kv:
        r.refuse("num_kv_heads", kv, f"must divide num_heads ({h})")
    return GLASpec(
        num_heads=h,
        kv_groups=h // kv,
        head_k_dim=round(key_dim) // h,
        head_v_dim=round(value_dim) // h,
        feature_map=fmap,
        conv_size=width if conv else 0,
        output_gate=gate,
        clamp_min=clamp,
        norm_weight=affine,
        norm_name="g_norm_swish_gate" if (fuse and gate) else "g_norm",
    )


def attn_tensors(s: GLASpec, c: CommonConfig) -> dict[str, tuple[int, ...]]:
    k, v = s.num_heads * s.head_k_dim, s.num_heads * s.head_v_dim
    kg, vg = k // s.kv_groups, v // s.kv_groups
    out: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (k, c.hidden_size),
        "k_proj.weight": (kg, c.hidden_size),
        "v_proj.weight": (vg, c.hidden_size),
        "gk_proj.0.weight": (GATE_RANK, c.hidden_size),
        "gk_proj.1.weight": (kg, GATE_RANK),
        "gk_proj.1.bias": (kg,),
        "o_proj.weight": (c.hidden_size, v),
    }
    if s.output_gate:
        out["g_proj.weight"] = (v, c.hidden_size)
    if s.conv_size:
        for n, d in (("q", k), ("k", kg), ("v", vg)):
            out[f"{n}_conv1d.weight"] = (d, 1, s.conv_size)
    if s.norm_weight:
        out[f"{s.norm_name}.weight"] = (s.head_v_dim,)
    return out


class GLAMixer:
    def __init__(self, s: GLASpec, c: CommonConfig, w: Mapping[str, Any], weights: Weights):
        self.s, self.eps, self.ops = s, c.norm_eps, weights.ops
        names = ["q", "k", "v"] + ["g"] * s.output_gate
        parts = [(n, w[f"{n}_proj.weight"]) for n in names] + [("gk0", w["gk_proj.0.weight"])]
        self.proj = weights.fused(parts)
        # the rank-16 gate: one call over all rows (ranges would not pay for themselves)
        self.gk1 = weights.dense(w["gk_proj.1.weight"], split=False)
        self.b_gk1 = weights.array(w["gk_proj.1.bias"])
        self.o_proj = weights.dense(w["o_proj.weight"])
        nw = w.get(f"{s.norm_name}.weight")
        self.norm_w = None if nw is None else weights.array(nw)
        convs = {n: w[f"{n}_conv1d.weight"] for n in "qkv"} if s.conv_size else {}
        self.conv = ConvSet(convs, {"q", "k", "v"}, weights)
        h, dk, dv = s.num_heads, s.head_k_dim, s.head_v_dim
        self.state_spec = StateSpec((("S", (h, dk, dv)), *self.conv.state_shapes()))

    def forward(self, x: np.ndarray, st: LayerState) -> tuple[np.ndarray, LayerState]:
        s, ops = self.s, self.ops
        p = self.proj(x)
        new: dict[str, Any] = {}
        q, k, v = p["q"], p["k"], p["v"]
        if s.conv_size:
            q, k, v = (self.conv(n, a, st, new) for n, a in (("q", q), ("k", k), ("v", v)))
        g = s.kv_groups
        # logsigmoid(gk + b) / 16, clamped, head-major: one pass (`fused.log_gate`)
        gk = self.gk1(p["gk0"])
        gh = ops.log_gate(gk, self.b_gk1, GATE_NORMALIZER, s.clamp_min, s.head_k_dim, g)
        qh = ops.head_major(q, s.head_k_dim)
        kh = ops.head_major(k, s.head_k_dim, g)
        vh = ops.head_major(v, s.head_v_dim, g)
        if s.feature_map is not None:
            qh, kh = ops.activation(s.feature_map, qh), ops.activation(s.feature_map, kh)
        qh *= x.dtype.type(s.head_k_dim**-0.5)
        state = ops.copy(st["S"])
        o = row_major(ops.vector_gated_chunks(qh, kh, vh, gh, state))
        gate = p["g"].reshape(o.shape) if s.output_gate else None
        o = ops.head_norm(o, self.norm_w, self.eps, gate, "swish")
        return self.o_proj(o.reshape(x.shape[0], -1)), ops.state({"S": state, **new})


def build(
    s: GLASpec,
    c: CommonConfig,
    w: Mapping[str, Any],
    weights: Weights,
    index: int,
    model: Mapping[str, Any],
) -> GLAMixer:
    return GLAMixer(s, c, w, weights)
