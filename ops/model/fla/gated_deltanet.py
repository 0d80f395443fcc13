"""Gated DeltaNet (model_type "gated_deltanet"; fla.layers.gated_deltanet.GatedDeltaNet), per
chunk.

With H query/key heads of d_k = head_dim, HV value heads (num_v_heads, a multiple of H) of
d_v = head_dim·expand_v:

    q, k, v = silu(conv(q_proj x)), silu(conv(k_proj x)), silu(conv(v_proj x))
              (without convs: silu of the projections)
    q, k L2-normalized, x / sqrt(Σx² + 1e-6); value head j reads q/k head j // (HV/H)
    log α = −exp(A_log) · softplus(a_proj x + dt_bias)         one gate per value head
    β     = sigmoid(b_proj x), × 2 with allow_neg_eigval
    S_t = α_t (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,  o_t = S_tᵀ (q_t d_k^-0.5)
                                                                 (the delta kernel, gated)
    o = RMSNorm per head · act(g_proj x) with use_gate (act: swish/silu or sigmoid, the config's
        output_gate_activation), plain RMSNorm without ; out = o_proj o
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

__all__ = ["GatedDeltaNetSpec", "attn_tensors", "build", "parse"]


GATE_ACTIVATIONS = ("swish", "silu", "sigmoid")


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    num_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_size: int
    allow_neg_eigval: bool
    use_gate: bool
    gate_activation: str


def parse(r: ConfigReader, c: CommonConfig) -> GatedDeltaNetSpec:
    h = r.get("num_heads", 6, "pos_int")
    hv = r.get("num_v_heads", None, "pos_int?") or h
    dk = r.get("head_dim", 256, "pos_int")
    ev = r.get("expand_v", 2.0, "pos_float")
    conv = r.get("use_short_conv", True, "bool")
    width = r.get("conv_size", 4, "pos_int")
    act = r.get("output_gate_activation", "swish", "str")
    r.require(
        "output_gate_activation", act, GATE_ACTIVATIONS, f"fla 0.6.0 has {list(GATE_ACTIVATIONS)}"
    )
    r.require(
        "attn_mode",
        r.get("attn_mode", "chunk", "str"),
        ("chunk", "fused_recurrent"),
        "not a Gated DeltaNet mode of fla 0.6.0",
    )
    if hv < h or hv % h:
        r.refuse("num_v_heads", hv, f"must be a multiple of num_heads ({h})")
    dv = dk * ev
    if dv != round(dv):
        r.refuse("expand_v", ev, f"head_dim · expand_v = {dv} must be an integer")
    return GatedDeltaNetSpec(
        num_heads=h,
        num_v_heads=hv,
        head_k_dim=dk,
        head_v_dim=round(dv),
        conv_size=width if conv else 0,
        allow_neg_eigval=r.get("allow_neg_eigval", False, "bool"),
        use_gate=r.get("use_gate", True, "bool"),
        gate_activation=act,
    )


def attn_tensors(s: GatedDeltaNetSpec, c: CommonConfig) -> dict[str, tuple[int, ...]]:
    k, v = s.num_heads * s.head_k_dim, s.num_v_heads * s.head_v_dim
    out: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (k, c.hidden_size),
        "k_proj.weight": (k, c.hidden_size),
        "v_proj.weight": (v, c.hidden_size),
        "a_proj.weight": (s.num_v_heads, c.hidden_size),
        "b_proj.weight": (s.num_v_heads, c.hidden_size),
        "A_log": (s.num_v_heads,),
        "dt_bias": (s.num_v_heads,),
        "o_norm.weight": (s.head_v_dim,),
        "o_proj.weight": (c.hidden_size, v),
    }
    if s.use_gate:
        out["g_proj.weight"] = (v, c.hidden_size)
    if s.conv_size:
        for n, d in (("q", k), ("k", k), ("v", v)):
            out[f"{n}_conv1d.weight"] = (d, 1, s.conv_size)
    return out


class GatedDeltaNetMixer:
    def __init__(
        self, s: GatedDeltaNetSpec, c: CommonConfig, w: Mapping[str, Any], weights: Weights
    ) -> None:
        self.s, self.eps, self.ops = s, c.norm_eps, weights.ops
        names = ["q", "k", "v", "a", "b"] + ["g"] * s.use_gate
        self.proj = weights.fused([(n, w[f"{n}_proj.weight"]) for n in names])
        self.o_proj = weights.dense(w["o_proj.weight"])
        self.norm_w = weights.array(w["o_norm.weight"])
        a = -np.exp(np.asarray(w["A_log"], np.float64))
        self.a = weights.array(a, np.float64)  # −exp(A_log), float64, formed on the host
        self.dt_bias = weights.array(w["dt_bias"], np.float64)
        convs = {n: w[f"{n}_conv1d.weight"] for n in "qkv"} if s.conv_size else {}
        self.conv = ConvSet(convs, {"q", "k", "v"}, weights)
        hv, dk, dv = s.num_v_heads, s.head_k_dim, s.head_v_dim
        self.state_spec = StateSpec((("S", (hv, dk, dv)), *self.conv.state_shapes()))

    def forward(self, x: np.ndarray, st: LayerState) -> tuple[np.ndarray, LayerState]:
        s, ops = self.s, self.ops
        xp = ops.xp
        t = x.shape[0]
        p = self.proj(x)
        new: dict[str, Any] = {}
        dk, dv = s.head_k_dim, s.head_v_dim
        r = s.num_v_heads // s.num_heads
        if s.conv_size:  # each convolution writes its heads (and L2-normalizes q and k)
            if r == 1:
                qh = self.conv("q", p["q"], st, new, dk, dk**-0.5)
                kh = self.conv("k", p["k"], st, new, dk, 1.0)
            else:
                q, k = self.conv("q", p["q"], st, new), self.conv("k", p["k"], st, new)
            vh = self.conv("v", p["v"], st, new, dv)  # (the tails in q, k, v order)
        else:
            q, k, vh = ops.silu(p["q"]), ops.silu(p["k"]), ops.head_major(ops.silu(p["v"]), dv)
        if r > 1 or not s.conv_size:  # grouped heads: q and k heads repeated, then normalized
            qh = ops.l2_norm(ops.head_major(q, dk, r))
            kh = ops.l2_norm(ops.head_major(k, dk, r))
            qh *= x.dtype.type(dk**-0.5)
        log_alpha = self.a * ops.softplus(p["a"].astype(np.float64) + self.dt_bias)  # [T, HV]
        beta = ops.sigmoid(p["b"].astype(np.float64))
        if s.allow_neg_eigval:
            beta = beta * 2.0
        state = ops.copy(st["S"])
        o = ops.delta_chunks(
            qh,
            kh,
            vh,
            state,
            xp.ascontiguousarray(log_alpha.T),
            xp.ascontiguousarray(beta.T),
        )
        o = row_major(o)
        gate = p["g"].reshape(o.shape) if s.use_gate else None
        o = ops.head_norm(o, self.norm_w, self.eps, gate, s.gate_activation)
        return self.o_proj(o.reshape(t, -1)), ops.state({"S": state, **new})


def build(
    s: GatedDeltaNetSpec,
    c: CommonConfig,
    w: Mapping[str, Any],
    weights: Weights,
    index: int,
    model: Mapping[str, Any],
) -> GatedDeltaNetMixer:
    return GatedDeltaNetMixer(s, c, w, weights)
