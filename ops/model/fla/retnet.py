"""RetNet (model_type "retnet"; fla.layers.multiscale_retention.MultiScaleRetention), per chunk.

With K = hidden·expand_k, V = hidden·expand_v, H heads of d_k = K/H and d_v = V/H, and G query
heads per key/value head (num_kv_heads):

    q, k, v = q_proj x, k_proj x, v_proj x ; q, k through the feature map if one is set
    q, k rotated (rotary, halves not interleaved, base 10000) at their absolute positions
    k, v repeated so that query head h reads key/value head h // G; q scaled by d_k^-0.5
    S_t = γ_h S_{t-1} + k_t v_tᵀ,  o_t = S_tᵀ q_t,   γ_h = 1 − 2^(−5−h)     (the decay kernel)
    o = RMSNorm per head (· silu(g_proj x) with the output gate) ; out = o_proj o

The position is part of the carried state: a chunk's first token rotates at the number of tokens
the sequence has seen.  fla 0.6.0's RetNet block passes no short convolution to the layer, so a
config asking for one (`use_short_conv`) is refused rather than silently run without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import CommonConfig, ConfigReader
from .dense import Weights
from .families import row_major
from .gla import FEATURE_MAPS
from .state import POSITION, LayerState, StateSpec

__all__ = ["RetNetSpec", "attn_tensors", "build", "decays", "parse"]


MAX_HEAD_K_DIM = 256  # fla asserts it


@dataclass(frozen=True)
class RetNetSpec:
    num_heads: int
    kv_groups: int
    head_k_dim: int
    head_v_dim: int
    feature_map: str | None
    output_gate: bool
    norm_weight: bool
    norm_name: str


def parse(r: ConfigReader, c: CommonConfig) -> RetNetSpec:
    h = r.get("num_heads", 8, "pos_int")
    kv = r.get("num_kv_heads", None, "pos_int?") or h
    ek = r.get("expand_k", 1.0, "pos_float")
    ev = r.get("expand_v", 2.0, "pos_float")
    fmap = r.get("feature_map", None, "str?")
    if fmap is not None:
        r.require("feature_map", fmap, FEATURE_MAPS, f"the runtime has {list(FEATURE_MAPS)}")
    gate = r.get("use_output_gate", True, "bool")
    affine = bool(r.get("elementwise_affine", True, "bool?"))
    fuse = r.get("fuse_norm", True, "bool")
    r.require(
        "attn_mode",
        r.get("attn_mode", "chunk", "str"),
        ("chunk", "fused_chunk", "parallel", "fused_recurrent"),
        "not a RetNet mode of fla 0.6.0",
    )
    r.only_default(
        "use_short_conv",
        False,
        "fla 0.6.0's RetNet block builds no short "
        "convolution whatever this says, so the checkpoint cannot run as trained",
    )
    r.get("conv_size", 4, "pos_int")  # inert without convolutions
    key_dim, value_dim = c.hidden_size * ek, c.hidden_size * ev
    for name, ratio, dim in (("expand_k", ek, key_dim), ("expand_v", ev, value_dim)):
        if dim != round(dim) or round(dim) % h or round(dim) % kv:
            r.refuse(
                name,
                ratio,
                f"hidden_size · {name} = {dim} must be an "
                f"integer divisible by num_heads ({h}) and num_kv_heads ({kv})",
            )
    if h % kv:
        r.refuse("num_kv_heads", kv, f"must divide num_heads ({h})")
    dk = round(key_dim) // h
    if dk > MAX_HEAD_K_DIM or dk % 2:
        r.refuse("expand_k", ek, f"the head key size {dk} must be even and at most 256")
    return RetNetSpec(
        num_heads=h,
        kv_groups=h // kv,
        head_k_dim=dk,
        head_v_dim=round(value_dim) // h,
        feature_map=fmap,
        output_gate=gate,
        norm_weight=affine,
        norm_name="g_norm_swish_gate" if (fuse and gate) else "g_norm",
    )


def attn_tensors(s: RetNetSpec, c: CommonConfig) -> dict[str, tuple[int, ...]]:
    k, v = s.num_heads * s.head_k_dim, s.num_heads * s.head_v_dim
    out: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (k, c.hidden_size),
        "k_proj.weight": (k // s.kv_groups, c.hidden_size),
        "v_proj.weight": (v // s.kv_groups, c.hidden_size),
        "o_proj.weight": (c.hidden_size, v),
    }
    if s.output_gate:
        out["g_proj.weight"] = (v, c.hidden_size)
    if s.norm_weight:
        out[f"{s.norm_name}.weight"] = (s.head_v_dim,)
    return out


def decays(num_heads: int) -> np.ndarray:
    """log γ_h = log(1 − 2^(−5−h)) per head, float64 (fla forms them in float32)."""
    return np.log1p(-(2.0 ** (-5.0 - np.arange(num_heads, dtype=np.float64))))


class RetNetMixer:
    def __init__(self, s: RetNetSpec, c: CommonConfig, w: Mapping[str, Any], weights: Weights):
        self.s, self.eps, self.ops = s, c.norm_eps, weights.ops
        names = ["q", "k", "v"] + ["g"] * s.output_gate
        self.proj = weights.fused([(n, w[f"{n}_proj.weight"]) for n in names])
        self.o_proj = weights.dense(w["o_proj.weight"])
        nw = w.get(f"{s.norm_name}.weight")
        self.norm_w = None if nw is None else weights.array(nw)
        self.log_gamma = weights.array(decays(s.num_heads), np.float64)
        h, dk, dv = s.num_heads, s.head_k_dim, s.head_v_dim
        self.state_spec = StateSpec((("S", (h, dk, dv)), (POSITION, (1,))))

    def forward(self, x: np.ndarray, st: LayerState) -> tuple[np.ndarray, LayerState]:
        s, ops = self.s, self.ops
        xp = ops.xp
        t = x.shape[0]
        p = self.proj(x)
        q = p["q"].reshape(t, s.num_heads, s.head_k_dim)
        k = p["k"].reshape(t, -1, s.head_k_dim)
        if s.feature_map is not None:
            q, k = ops.activation(s.feature_map, q), ops.activation(s.feature_map, k)
        start = int(st[POSITION][0])
        cos, sin = ops.rotary_tables(s.head_k_dim, start, t, x.dtype)
        g, dk = s.kv_groups, s.head_k_dim  # rotated, scaled (q), head-major: one pass each
        qh = ops.rotary_heads(q.reshape(t, -1), cos, sin, dk, dk**-0.5)
        kh = ops.rotary_heads(k.reshape(t, -1), cos, sin, dk, None, g)
        vh = ops.head_major(p["v"], s.head_v_dim, g)
        h, dv = s.num_heads, s.head_v_dim
        ones = xp.ones((h, t, 1), dtype=x.dtype)  # the decay kernel carries z as a last column
        sx = xp.zeros((h, s.head_k_dim, dv + 1), dtype=st["S"].dtype)
        sx[:, :, :dv] = st["S"]
        log_gate = xp.repeat(self.log_gamma[:, None], t, axis=1)
        o = ops.decay_chunks(
            qh,
            kh,
            xp.concatenate([vh, ones], axis=2),
            sx,
            log_gate,
            xp.zeros((h, t)),
            normalize=False,
        )
        o = row_major(o)
        gate = p["g"].reshape(o.shape) if s.output_gate else None
        o = ops.head_norm(o, self.norm_w, self.eps, gate, "swish")
        new = {"S": xp.ascontiguousarray(sx[:, :, :dv]), POSITION: np.array([start + t], np.int64)}
        return self.o_proj(o.reshape(t, -1)), ops.state(new)


def build(
    s: RetNetSpec,
    c: CommonConfig,
    w: Mapping[str, Any],
    weights: Weights,
    index: int,
    model: Mapping[str, Any],
) -> RetNetMixer:
    return RetNetMixer(s, c, w, weights)
