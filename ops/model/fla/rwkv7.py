"""RWKV-7 "Goose" (model_type "rwkv7"; fla.models.rwkv7, fla.layers.rwkv7.RWKV7Attention), per
chunk: its own block, layout and config keys.

A block (fla's RWKV7Block), x the residual stream, LN a LayerNorm (bias unless norm_bias is off):

    x = pre_norm(x)                                   layer 0 only, with norm_first
    h = attn_norm(x);  x = x + time_mix(h);  h = ffn_norm(x);  x = x + channel_mix(h)

The time mix, with δ_t = h_{t−1} − h_t (the token shift; h_{−1} the previous chunk's last h,
carried) and x_c = h + δ ⊙ x_c for c in r, w, k, v, a, g:

    r, k, v = r_proj x_r, k_proj x_k, v_proj x_v
    w = −e^{−1/2} · sigmoid(W_w2 tanh(W_w1 x_w) + b_w)       the log decay, in (−0.607, 0)
    v = v + (v_first − v) · sigmoid(W_v2 W_v1 x_v + b_v)     layers after the first; v_first
                                                             is layer 0's v of the same token
    α = sigmoid(W_a2 W_a1 x_a + b_a);  g = W_g2 sigmoid(W_g1 x_g)
    k̂ = normalize(k ⊙ k_k) per head                         (fuse_norm: k/√(Σk² + 1e-6), else
                                                              k / max(‖k‖, 1e-12): fla's two)
    k = k ⊙ (1 + (α − 1) ⊙ k_a)
    S_t = diag(e^{w_t}) S_{t−1} − (k̂_t α_t)(k̂_tᵀ S_{t−1}) + k_t v_tᵀ,  o_t = S_tᵀ r_t
                                                             (the DPLR kernel: a = −k̂, b = k̂α)
    o = GroupNorm per head (eps head_dim · norm_eps) + (Σ_head r ⊙ k ⊙ r_k) v;  out = o_proj(o ⊙ g)

and the channel mix: its own shift, x_k = h + δ ⊙ ffn.x_k, out = value(relu(key x_k)²).

State per layer (`state.StateSpec`, the same for every layer): `S` [H, head_dim, head_v_dim]
(key-major, as fla's recurrent_state), `shift_attn` and `shift_ffn` [hidden]: the last token's
attn_norm and ffn_norm outputs (fla's conv_state and ffn_state).  v_first is not state: layer 0
computes it from the same tokens, and hands it to the later layers through the chunk's carry.

Where it runs: through the factory's compute backend (`weights.ops`): its DPLR kernel (the
Numba one on the host, the CUDA one with the device's launcher on a device), and the elementwise
steps (`RWKV7Ops`): the fused Numba passes (`rwkv7_passes`) on the host, the same steps as
array expressions of the device's namespace (`rwkv7_xp`) on a device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from linstream.ops.dplr.constants import DEFAULT_DPLR_CHUNK

from . import rwkv7_xp
from .block import ModelLayout, Norm, NormSpec
from .compute import Compute
from .config import CommonConfig, ConfigReader, refuse_hybrid
from .dense import Weights
from .state import LayerState, StateSpec

__all__ = [
    "RWKV7Block",
    "RWKV7Ops",
    "RWKV7Spec",
    "build_block",
    "layer_tensors",
    "layout",
    "parse",
    "parse_common",
]

DECAY_SCALE = -0.6065306597126334  # −e^{−1/2}: fla's w = DECAY_SCALE · sigmoid(w_lora(x_w))
MIXES = ("r", "w", "k", "v", "a", "g")  # the time mix's token-shift mixes, in fla's order


@dataclass(frozen=True)
class RWKV7Spec:
    num_heads: int
    head_dim: int
    value_dim: int
    decay_rank: int
    a_rank: int
    v_rank: int
    gate_rank: int
    norm_first: bool
    norm_bias: bool
    fuse_norm: bool

    @property
    def head_v_dim(self) -> int:
        return self.value_dim // self.num_heads


def parse_common(r: ConfigReader) -> CommonConfig:
    """RWKV7Config's shared keys: its defaults, its FFN width (hidden · hidden_ratio, up to a
    multiple of 32) and its activation (sqrelu, the only one the channel mix runs here)."""
    hidden = r.get("hidden_size", 2048, "pos_int")
    layers = r.get("num_hidden_layers", 24, "pos_int")
    vocab = r.get("vocab_size", 32000, "pos_int")
    eps = r.get("norm_eps", 1e-5, "pos_float")
    ratio = r.get("hidden_ratio", 4, "pos_float?")
    inter = r.get("intermediate_size", None, "pos_int?")
    if inter is None:  # fla.models.rwkv7.RWKV7FeedForward
        inter = 32 * ((int(hidden * (4 if ratio is None else ratio)) + 31) // 32)
    act = r.get("hidden_act", "sqrelu", "str")
    r.require("hidden_act", act, ("sqrelu",), "the channel mix runs sqrelu (relu²) only")
    refuse_hybrid(r)
    return CommonConfig(r.family, hidden, layers, vocab, eps, int(inter))


def _rank(r: ConfigReader, key: str, default: int, auto: int) -> int:
    """A LoRA rank: the key's value, or (null) the layer's own formula."""
    value = r.get(key, default, "pos_int?")
    return auto if value is None else int(value)


def _value_dim(r: ConfigReader, c: CommonConfig) -> int:
    """value_dim: null (hidden_size), one number, or one per layer; every layer must have the
    same (one state layout, and layer 0's v is mixed into every later layer's)."""
    raw = r.raw.get("value_dim")
    r.read.add("value_dim")
    given: Any = [c.hidden_size] * c.num_layers if raw is None else raw
    if isinstance(given, int) and not isinstance(given, bool):
        given = [given] * c.num_layers
    ok = isinstance(given, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given
    )
    values: list[int] = given if ok else []
    if len(values) != c.num_layers:
        r.fail(
            f"config option value_dim = {raw!r}: expected null, a positive integer or a list of "
            f"{c.num_layers} (one per layer)"
        )
    if any(v < c.hidden_size or v % c.hidden_size for v in values):
        r.refuse("value_dim", raw, f"must be a multiple of hidden_size ({c.hidden_size})")
    if len(set(values)) > 1:
        r.refuse(
            "value_dim",
            raw,
            "layers of different value widths carry states of different shapes (and fla mixes "
            "layer 0's v into every later layer's)",
        )
    return int(values[0])


def parse(r: ConfigReader, c: CommonConfig) -> RWKV7Spec:
    hd = r.get("head_dim", 64, "pos_int?")
    heads = r.get("num_heads", None, "pos_int?")
    if hd is None:  # RWKV7Config: head_dim from num_heads; the layer then uses head_dim only
        if heads is None:
            r.refuse("head_dim", None, "one of head_dim and num_heads must be set")
        hd = c.hidden_size // heads
    if hd < 1 or c.hidden_size % hd:
        r.refuse("head_dim", hd, f"must divide hidden_size ({c.hidden_size})")
    h = c.hidden_size // hd
    dv = _value_dim(r, c)
    if dv % h:
        r.refuse("value_dim", dv, f"must be a multiple of the number of heads ({h})")
    r.require(
        "attn_mode",
        r.get("attn_mode", "chunk", "str"),
        ("chunk", "fused_recurrent"),
        "not an RWKV-7 mode of fla 0.6.0",
    )
    root, factor = c.hidden_size**0.5, hd / 64  # RWKV7Attention's ranks for a null (its order)
    kd = (2.5 * root) * factor / 32
    return RWKV7Spec(
        num_heads=h,
        head_dim=hd,
        value_dim=dv,
        decay_rank=_rank(r, "decay_low_rank_dim", 64, max(32, round(kd) * 32)),
        a_rank=_rank(r, "a_low_rank_dim", 64, max(32, round(kd) * 32)),
        v_rank=_rank(r, "v_low_rank_dim", 16, max(32, round((1.7 * root) * factor / 32) * 32)),
        gate_rank=_rank(r, "gate_low_rank_dim", 128, max(32, round(5 * root / 32) * 32)),
        norm_first=r.get("norm_first", True, "bool"),
        norm_bias=r.get("norm_bias", True, "bool"),
        fuse_norm=r.get("fuse_norm", True, "bool"),
    )


def _norm(name: str, s: RWKV7Spec) -> NormSpec:
    bias = f"{name}.bias" if s.norm_bias else None
    return NormSpec(kind="layer", weight=f"{name}.weight", bias=bias)


def layout(s: RWKV7Spec, c: CommonConfig) -> ModelLayout:
    """fla's layout with a LayerNorm (bias unless norm_bias is off) as the final norm."""
    return ModelLayout(final_norm=_norm("norm", s))


def _lora(name: str, out: int, rank: int, d: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        f"attn.{name}.lora.0.weight": (rank, d),
        f"attn.{name}.lora.2.weight": (out, rank),
    }
    if bias:
        shapes[f"attn.{name}.lora.2.bias"] = (out,)
    return shapes


def layer_tensors(s: RWKV7Spec, c: CommonConfig, index: int) -> dict[str, tuple[int, ...]]:
    d, dv = c.hidden_size, s.value_dim
    names = ["attn_norm", "ffn_norm"] + ["pre_norm"] * (s.norm_first and index == 0)
    out: dict[str, tuple[int, ...]] = {}
    for n in names:
        out.update(_norm(n, s).tensors(d))
    out.update({f"attn.x_{m}": (1, 1, d) for m in MIXES})
    out.update({"attn.k_k": (d,), "attn.k_a": (d,), "attn.r_k": (s.num_heads, s.head_dim)})
    out.update({"attn.r_proj.weight": (d, d), "attn.k_proj.weight": (d, d)})
    out.update({"attn.v_proj.weight": (dv, d), "attn.o_proj.weight": (d, dv)})
    out.update(_lora("w_lora", d, s.decay_rank, d, True))
    out.update(_lora("a_lora", d, s.a_rank, d, True))
    if index != 0:
        out.update(_lora("v_lora", dv, s.v_rank, d, True))
    out.update(_lora("g_lora", dv, s.gate_rank, d, False))
    out.update({"attn.g_norm.weight": (dv,), "attn.g_norm.bias": (dv,)})
    out.update({"ffn.x_k": (d,), "ffn.key.weight": (c.intermediate_size, d)})
    out["ffn.value.weight"] = (d, c.intermediate_size)
    return out


#: the passes of `rwkv7_passes` the block calls, by name (`rwkv7_xp` has each, xp first)
PASSES = (
    "shift_mix",
    "decay_",
    "sigmoid_",
    "v_residual",
    "keys",
    "group_norm_out_",
    "sqrelu_",
    "layer_norm",
    "add_layer_norm",
)


class RWKV7Ops:
    """The block's elementwise passes where the factory's backend runs (`ops`): the Numba passes
    on the host (today's functions themselves, imported at the first call, as `compute` imports
    the host's kernels: the host's bits unchanged, and a device never imports Numba), the array
    expressions of ops.xp on a device.  Holds no array (no `__dict__`: `block.held_arrays`
    finds nothing here)."""

    __slots__ = ("_fns", "_ops", "xp")

    def __init__(self, ops: Compute) -> None:
        self._ops, self.xp = ops, ops.xp
        self._fns: dict[str, Callable[..., Any]] = {}

    def _get(self, name: str) -> Callable[..., Any]:
        if not self._fns:
            ops = self._ops
            if ops.device:
                self._fns = {n: functools.partial(getattr(rwkv7_xp, n), ops.xp) for n in PASSES}
            else:
                from . import rwkv7_passes

                self._fns = {n: getattr(rwkv7_passes, n) for n in PASSES}
        return self._fns[name]

    def shift_mix(self, *args: Any) -> Any:
        return self._get("shift_mix")(*args)

    def decay_(self, *args: Any) -> Any:
        return self._get("decay_")(*args)

    def sigmoid_(self, *args: Any) -> Any:
        return self._get("sigmoid_")(*args)

    def v_residual(self, *args: Any) -> Any:
        return self._get("v_residual")(*args)

    def keys(self, *args: Any) -> Any:
        return self._get("keys")(*args)

    def group_norm_out_(self, *args: Any) -> Any:
        return self._get("group_norm_out_")(*args)

    def sqrelu_(self, *args: Any) -> Any:
        return self._get("sqrelu_")(*args)

    def layer_norm(self, *args: Any) -> Any:
        return self._get("layer_norm")(*args)

    def add_layer_norm(self, *args: Any) -> Any:
        return self._get("add_layer_norm")(*args)


class RWKV7Block:
    """One RWKV-7 layer (see the module docstring)."""

    def __init__(
        self, s: RWKV7Spec, c: CommonConfig, t: Mapping[str, Any], weights: Weights, index: int
    ) -> None:
        self.s, self.index = s, index
        self.ops, self.p = weights.ops, RWKV7Ops(weights.ops)
        d = c.hidden_size
        eps = c.norm_eps

        def norm(name: str) -> Norm:
            return Norm.build(_norm(name, s), t, weights, eps)

        self.pre_norm = norm("pre_norm") if s.norm_first and index == 0 else None
        self.attn_norm, self.ffn_norm = norm("attn_norm"), norm("ffn_norm")
        self.weights = weights  # its `together`: independent products in one hand-off
        self.mix = weights.xp.stack([weights.array(t[f"attn.x_{m}"]).reshape(d) for m in MIXES])
        self.k_k = weights.array(t["attn.k_k"])
        self.k_a = weights.array(t["attn.k_a"])
        self.r_k = weights.array(t["attn.r_k"])
        self.r_proj = weights.dense(t["attn.r_proj.weight"])
        self.k_proj = weights.dense(t["attn.k_proj.weight"])
        v_parts = [("v", t["attn.v_proj.weight"])]
        if index != 0:  # v_lora's first product shares v_proj's input
            v_parts.append(("v_lora", t["attn.v_lora.lora.0.weight"]))
        self.v_proj = weights.fused(v_parts)
        self.o_proj = weights.dense(t["attn.o_proj.weight"])
        # rank 64-128 from hidden: at a 2,048-token chunk each is ~10⁸ multiply-adds, worth the
        # row ranges (one call over all rows would leave the second thread idle)
        self.lora_in = {n: weights.dense(t[f"attn.{n}_lora.lora.0.weight"]) for n in "wag"}
        self.lora_out = {
            n: weights.dense(t[f"attn.{n}_lora.lora.2.weight"]) for n in "wag" + "v" * (index != 0)
        }
        self.lora_bias = {
            n: weights.array(t[f"attn.{n}_lora.lora.2.bias"]) for n in "wa" + "v" * (index != 0)
        }
        self.g_norm_w = weights.array(t["attn.g_norm.weight"])
        self.g_norm_b = weights.array(t["attn.g_norm.bias"])
        self.g_norm_eps = s.head_dim * eps
        self.ffn_mix = weights.array(t["ffn.x_k"])
        self.key = weights.dense(t["ffn.key.weight"])
        self.value = weights.dense(t["ffn.value.weight"])
        self.state_spec = StateSpec(
            (
                ("S", (s.num_heads, s.head_dim, s.head_v_dim)),
                ("shift_attn", (d,)),
                ("shift_ffn", (d,)),
            )
        )

    def forward(
        self, x: np.ndarray, state: LayerState, carry: dict[str, Any]
    ) -> tuple[np.ndarray, LayerState]:
        p = self.p
        if self.pre_norm is not None:
            x = self._layer_norm(self.pre_norm, x)
        h = self._layer_norm(self.attn_norm, x)
        attn, s_new = self._time_mix(h, state, carry)
        n = self.ffn_norm
        assert n.weight is not None
        x, f = p.add_layer_norm(x, attn, n.weight, n.bias, n.eps)
        xk = p.shift_mix(f, state["shift_ffn"], self.ffn_mix[None])[0]
        x += self.value(p.sqrelu_(self.key(xk)))
        new = {"S": s_new, "shift_attn": h[-1].copy(), "shift_ffn": f[-1].copy()}
        return x, self.ops.state(new)

    def _time_mix(
        self, h: np.ndarray, state: LayerState, carry: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        s, p, xp = self.s, self.p, self.p.xp
        t = h.shape[0]
        nh, hd, hv = s.num_heads, s.head_dim, s.head_v_dim
        xr, xw, xk, xv, xa, xg = p.shift_mix(h, state["shift_attn"], self.mix)
        lora = self.lora_in
        pairs = [(self.r_proj, xr), (self.k_proj, xk), (self.v_proj, xv)]
        pairs += [(lora["w"], xw), (lora["a"], xa), (lora["g"], xg)]
        r, k, pv, lw, la, lg = self.weights.together(pairs)
        w = p.decay_(self.lora_out["w"](xp.tanh(lw)), self.lora_bias["w"])
        if self.index == 0:
            v = xp.ascontiguousarray(pv["v"])
            carry["v_first"] = v
        else:
            gate = self.lora_out["v"](pv["v_lora"])
            v = p.v_residual(pv["v"], carry["v_first"], gate, self.lora_bias["v"])
        alpha = p.sigmoid_(self.lora_out["a"](la), self.lora_bias["a"])
        g = self.lora_out["g"](p.sigmoid_(lg))
        a, k, b = p.keys(k, alpha, self.k_k, self.k_a, hd, s.fuse_norm)
        state_s = self.ops.copy(state["S"])
        r3, k3, v3 = r.reshape(t, nh, hd), k.reshape(t, nh, hd), v.reshape(t, nh, hv)
        o = self.ops.dplr_chunks(
            r3,
            k3,
            v3,
            a.reshape(t, nh, hd),
            b.reshape(t, nh, hd),
            w.reshape(t, nh, hd),
            state_s,
            chunk_size=DEFAULT_DPLR_CHUNK,
        )
        o = p.group_norm_out_(
            o, r3, k3, v3, self.r_k, g.reshape(t, nh, hv), self.g_norm_w, self.g_norm_b,
            self.g_norm_eps,
        )  # fmt: skip
        return self.o_proj(o.reshape(t, -1)), state_s

    def _layer_norm(self, n: Norm, x: np.ndarray) -> np.ndarray:
        assert n.weight is not None
        return self.p.layer_norm(x, n.weight, n.bias, n.eps)


def build_block(
    s: RWKV7Spec,
    c: CommonConfig,
    tensors: Mapping[str, Any],
    weights: Weights,
    index: int,
    model: Mapping[str, Any],
) -> RWKV7Block:
    return RWKV7Block(s, c, tensors, weights, index)
