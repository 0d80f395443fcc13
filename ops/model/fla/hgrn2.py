"""HGRN2 (model_type "hgrn2"; fla.layers.hgrn2.HGRN2Attention), per chunk: the GLA recurrence
with the forget gate as the key and the expand ratio E as the head size.

With H = hidden / E heads (E = expand_ratio; without it H = num_heads and E = hidden / H):

    q, f, i = q_proj x, f_proj x, i_proj x            (each through its short conv if any,
                                                       without an activation inside)
    q = silu(q) ; g = logsigmoid(f), and for layers after the first, with the layer's lower
    bound lb:  g = log(lb + (1 − lb) · e^g) = logaddexp(log lb, log1p(−lb) + g)
    k = 1 − e^g                                        (the key is what the gate forgets)
    S_t = diag(e^{g_t}) S_{t-1} + k_t i_tᵀ,  o_t = S_tᵀ (q_t E^-0.5)       (the vector gate)
    out = o_proj RMSNorm(o) over the whole hidden size, eps 1e-5 (fla passes no eps there)

The lower bounds: lb = cumsum(softmax(lower_bounds, over layers)) − its first row, one row of
`model.lower_bounds` [L, hidden] per layer (formed in float64 here; fla forms them in float32).
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

__all__ = ["HGRN2Spec", "attn_tensors", "build", "lower_bounds", "model_tensors", "parse"]


OUTPUT_NORM_EPS = 1e-5  # rms_norm_linear's default: HGRN2 passes no eps to its output norm


@dataclass(frozen=True)
class HGRN2Spec:
    num_heads: int
    expand_ratio: int  # the key size of a head
    conv_size: int
    use_lower_bound: bool
    norm_weight: bool


def parse(r: ConfigReader, c: CommonConfig) -> HGRN2Spec:
    heads = r.get("num_heads", None, "pos_int?")
    ratio = r.get("expand_ratio", 128, "pos_int?")
    if ratio is not None:  # the layer recomputes num_heads from expand_ratio when it is set
        h = c.hidden_size // ratio
    elif heads is not None:
        h, ratio = heads, c.hidden_size // heads
    else:
        r.refuse("expand_ratio", None, "one of expand_ratio and num_heads must be set")
    if h < 1 or c.hidden_size % h:
        r.refuse("expand_ratio", ratio, f"gives {h} heads, which must divide hidden_size")
    conv = r.get("use_short_conv", False, "bool")
    width = r.get("conv_size", 4, "pos_int")
    r.require(
        "attn_mode",
        r.get("attn_mode", "chunk", "str"),
        ("chunk", "fused_recurrent", "fused_chunk"),
        "not an HGRN2 mode of fla 0.6.0",
    )
    return HGRN2Spec(
        num_heads=h,
        expand_ratio=int(ratio),
        conv_size=width if conv else 0,
        use_lower_bound=r.get("use_lower_bound", True, "bool"),
        norm_weight=bool(r.get("elementwise_affine", True, "bool?")),
    )


def attn_tensors(s: HGRN2Spec, c: CommonConfig) -> dict[str, tuple[int, ...]]:
    f = s.num_heads * s.expand_ratio
    d = c.hidden_size
    out: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (f, d),
        "f_proj.weight": (f, d),
        "i_proj.weight": (d, d),
        "o_proj.weight": (d, d),
    }
    if s.norm_weight:
        out["g_norm.weight"] = (d,)
    if s.conv_size:
        for n, dim in (("q", f), ("f", f), ("i", d)):
            out[f"{n}_conv1d.weight"] = (dim, 1, s.conv_size)
    return out


def model_tensors(s: HGRN2Spec, c: CommonConfig) -> dict[str, tuple[int, ...]]:
    return {"lower_bounds": (c.num_layers, c.hidden_size)} if s.use_lower_bound else {}


def lower_bounds(raw: np.ndarray) -> np.ndarray:
    """[L, hidden] float64: cumsum(softmax over layers) − the first row (row 0 is zero)."""
    x = np.asarray(raw, dtype=np.float64)
    e = np.exp(x - x.max(axis=0, keepdims=True))
    sm = e / e.sum(axis=0, keepdims=True)
    return np.cumsum(sm, axis=0) - sm[0]


class HGRN2Mixer:
    def __init__(
        self,
        s: HGRN2Spec,
        c: CommonConfig,
        w: Mapping[str, Any],
        weights: Weights,
        index: int,
        model: Mapping[str, Any],
    ) -> None:
        self.s, self.ops = s, weights.ops
        self.proj = weights.fused([(n, w[f"{n}_proj.weight"]) for n in "qfi"])
        self.o_proj = weights.dense(w["o_proj.weight"])
        nw = w.get("g_norm.weight")
        self.norm_w = None if nw is None else weights.array(nw)
        self.lb: np.ndarray | None = None
        if s.use_lower_bound and index > 0:
            lb = lower_bounds(np.asarray(model["lower_bounds"], np.float64))[index]
            self.lb = weights.array(np.stack([np.log(lb), np.log1p(-lb)]), np.float64)  # [2, D]
        convs = {n: w[f"{n}_conv1d.weight"] for n in "qfi"} if s.conv_size else {}
        self.conv = ConvSet(convs, set(), weights)
        h, e = s.num_heads, s.expand_ratio
        self.state_spec = StateSpec((("S", (h, e, c.hidden_size // h)), *self.conv.state_shapes()))

    def forward(self, x: np.ndarray, st: LayerState) -> tuple[np.ndarray, LayerState]:
        s, ops = self.s, self.ops
        xp = ops.xp
        t = x.shape[0]
        p = self.proj(x)
        new: dict[str, Any] = {}
        q, f, i = p["q"], p["f"], p["i"]
        if s.conv_size:
            q, f, i = (self.conv(n, a, st, new) for n, a in (("q", q), ("f", f), ("i", i)))
        q = ops.silu(q)
        g = ops.logsigmoid(f.astype(np.float64))
        if self.lb is not None:
            g = xp.logaddexp(self.lb[0], self.lb[1] + g)
        k = -xp.expm1(g)
        e = s.expand_ratio
        qh = ops.head_major(q, e)
        qh *= x.dtype.type(e**-0.5)
        kh = ops.head_major(k.astype(x.dtype), e)
        gh = ops.head_major(g.astype(x.dtype), e)
        vh = ops.head_major(i, x.shape[1] // s.num_heads)
        state = ops.copy(st["S"])
        o = row_major(ops.vector_gated_chunks(qh, kh, vh, gh, state)).reshape(t, -1)
        o = ops.rms_norm(o, self.norm_w, OUTPUT_NORM_EPS)
        return self.o_proj(o), ops.state({"S": state, **new})


def build(
    s: HGRN2Spec,
    c: CommonConfig,
    w: Mapping[str, Any],
    weights: Weights,
    index: int,
    model: Mapping[str, Any],
) -> HGRN2Mixer:
    return HGRN2Mixer(s, c, w, weights, index, model)
