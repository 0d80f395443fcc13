"""Mamba-2 (model_type "mamba2"): Hugging Face transformers' `Mamba2ForCausalLM` and fla's
`Mamba2ForCausalLM`, the same layer under two config dialects, per chunk.

A block is RMSNorm → mixer → residual add (no MLP); the model's final norm is `norm_f`.  With
I = expand · hidden = H · P (H heads of head_dim P), G groups of d_state N:

    z | xBC | dt = in_proj x                       xBC = x [I] | B [G·N] | C [G·N]; dt [H]
    x, B, C = SiLU(conv(xBC) + conv bias)          depthwise causal conv of width W, tail carried
    y = SSD(x, dt, A = −exp(A_log), B, C, D)       `linstream.ops.ssd` (time steps softplus(dt +
                                                   dt_bias) clamped to the time-step limit)
    out = out_proj gated_norm(y, z)                RMS(y · silu(z)) over G groups · weight

The carried state per layer: `S` [H, P, N], the SSM state per head as transformers' cache holds
it (head_dim before d_state), and `conv_xbc` [W−1, I + 2·G·N], the last W−1 raw inputs of the
convolution over x, B and C.

config.json: fla's dialect when it holds a key only fla 0.6.0's Mamba2Config has (norm_eps,
dt_limit, rmsnorm, ...), else transformers 5.24's; each read with its library's defaults, and
any key that library does not define refused (`config_mamba2`).

Where it runs: through the factory's compute backend (`weights.ops`): its RMSNorm and SSD
kernel (the Numba one on the host, the CUDA one with the device's launcher on a device), and
the convolution and gated norm (`Mamba2Ops`): the fused Numba passes (`mamba2_passes`) on the
host, the same passes as array expressions of the device's namespace (`mamba2_xp`) on a device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import mamba2_xp
from .block import ModelLayout, NormSpec
from .compute import Compute
from .config import CommonConfig
from .config_mamba2 import Mamba2Spec, parse, parse_common
from .dense import Weights
from .state import LayerState, StateSpec

__all__ = [
    "Mamba2Block",
    "Mamba2Ops",
    "build_block",
    "layer_tensors",
    "layout",
    "parse",
    "parse_common",
]


_LAYOUT = ModelLayout(
    prefixes=("backbone.",),
    embedding="embeddings.weight",
    final_norm=NormSpec(kind="rms", weight="norm_f.weight"),
    layers="layers.",
    ignored=("lm_head.weight",),
)


def layout(s: Mamba2Spec, c: CommonConfig) -> ModelLayout:
    return _LAYOUT


def _dims(s: Mamba2Spec, c: CommonConfig) -> tuple[int, int, int]:
    """(I, the convolution's width over x, B, C, the in-projection's width)."""
    inner = c.intermediate_size
    conv = inner + 2 * s.n_groups * s.state_size
    return inner, conv, inner + conv + s.num_heads


def layer_tensors(s: Mamba2Spec, c: CommonConfig, index: int) -> dict[str, tuple[int, ...]]:
    d = c.hidden_size
    inner, conv, proj = _dims(s, c)
    out: dict[str, tuple[int, ...]] = {
        "norm.weight": (d,),
        "mixer.in_proj.weight": (proj, d),
        "mixer.conv1d.weight": (conv, 1, s.conv_kernel),
        "mixer.dt_bias": (s.num_heads,),
        "mixer.A_log": (s.num_heads,),
        "mixer.D": (inner,) if s.d_has_hdim else (s.num_heads,),
        "mixer.out_proj.weight": (d, inner),
    }
    if s.gated_norm != "gate":
        out["mixer.norm.weight"] = (inner,)
    if s.use_conv_bias:
        out["mixer.conv1d.bias"] = (conv,)
    if s.use_bias:
        out["mixer.in_proj.bias"] = (proj,)
        out["mixer.out_proj.bias"] = (d,)
    return out


class Mamba2Ops:
    """The layer's passes between its products where the factory's backend runs (`ops`): the
    Numba passes on the host (today's functions themselves, imported at the first call, as
    `compute` imports the host's kernels: the host's bits unchanged, and a device never imports
    Numba), the array expressions of ops.xp on a device.  Holds no array (no `__dict__`:
    `block.held_arrays` finds nothing here)."""

    __slots__ = ("_fns", "_ops")

    def __init__(self, ops: Compute) -> None:
        self._ops = ops
        self._fns: dict[str, Callable[..., Any]] = {}

    def _get(self, name: str) -> Callable[..., Any]:
        if not self._fns:
            ops = self._ops
            if ops.device:
                self._fns = {
                    "conv_silu": functools.partial(mamba2_xp.conv_silu, ops.xp),
                    "gated_norm": functools.partial(mamba2_xp.gated_norm, ops.xp),
                }
            else:
                from . import mamba2_passes

                self._fns = {
                    "conv_silu": mamba2_passes.conv_silu,
                    "gated_norm": mamba2_passes.gated_norm,
                }
        return self._fns[name]

    def conv_silu(self, *args: Any) -> Any:
        return self._get("conv_silu")(*args)

    def gated_norm(self, *args: Any) -> Any:
        return self._get("gated_norm")(*args)


class Mamba2Block:
    """One Mamba-2 layer: norm, mixer, residual (see the module docstring)."""

    def __init__(
        self, s: Mamba2Spec, c: CommonConfig, w: Mapping[str, Any], weights: Weights
    ) -> None:
        self.s, self.eps = s, c.norm_eps
        self.ops, self.passes = weights.ops, Mamba2Ops(weights.ops)
        xp = weights.xp
        self.inner, self.conv_dim, _ = _dims(s, c)
        self.norm = weights.array(w["norm.weight"])
        # z | xBC | dt: three products of one input, each its own contiguous output (the passes
        # after them read it without a copy; one hand-off to the threads for the three)
        cuts = {"z": slice(0, self.inner), "xbc": slice(self.inner, self.inner + self.conv_dim)}
        cuts["dt"] = slice(self.inner + self.conv_dim, None)
        w_in = w["mixer.in_proj.weight"]
        self.in_proj = weights.fused([(name, w_in[c]) for name, c in cuts.items()])
        self.out_proj = weights.dense(w["mixer.out_proj.weight"])
        bias = _maybe(weights, w, "mixer.in_proj.bias")
        self.in_bias = None if bias is None else {n: bias[c] for n, c in cuts.items()}
        self.out_bias = _maybe(weights, w, "mixer.out_proj.bias")
        self.conv_w = xp.ascontiguousarray(weights.array(w["mixer.conv1d.weight"])[:, 0, :])
        self.conv_b = _maybe(weights, w, "mixer.conv1d.bias")
        self.a = -xp.exp(weights.array(w["mixer.A_log"], np.float64))  # A = −exp(A_log)
        self.dt_bias = weights.array(w["mixer.dt_bias"], np.float64)
        d = weights.array(w["mixer.D"])
        self.d = d.reshape(s.num_heads, s.head_dim) if s.d_has_hdim else d
        self.norm_w = _maybe(weights, w, "mixer.norm.weight")
        self.limit = s.time_step_limit
        self.state_spec = StateSpec(
            (
                ("S", (s.num_heads, s.head_dim, s.state_size)),
                ("conv_xbc", (s.conv_kernel - 1, self.conv_dim)),
            )
        )

    def forward(
        self, x: np.ndarray, state: LayerState, carry: dict[str, Any]
    ) -> tuple[np.ndarray, LayerState]:
        s, t, passes = self.s, x.shape[0], self.passes
        inner = self.inner
        p = self.in_proj(self.ops.rms_norm(x, self.norm, self.eps))
        if self.in_bias is not None:
            for name, b in self.in_bias.items():
                p[name] += b
        xbc, tail = passes.conv_silu(p["xbc"], state["conv_xbc"], self.conv_w, self.conv_b)
        gn = s.n_groups * s.state_size
        xs = xbc[:, :inner].reshape(t, s.num_heads, s.head_dim)
        b = xbc[:, inner : inner + gn].reshape(t, s.n_groups, s.state_size)
        c = xbc[:, inner + gn :].reshape(t, s.n_groups, s.state_size)
        ssm = self.ops.copy(state["S"])
        y = self.ops.ssd_chunks(
            xs,
            p["dt"],
            self.a,
            b,
            c,
            self.d,
            ssm,
            dt_bias=self.dt_bias,
            dt_limit=self.limit,
        )
        o = passes.gated_norm(
            y.reshape(t, inner), p["z"], self.norm_w, s.n_groups, self.eps, s.gated_norm
        )
        out = self.out_proj(o)
        if self.out_bias is not None:
            out += self.out_bias
        return x + out, self.ops.state({"S": ssm, "conv_xbc": tail})


def _maybe(weights: Weights, w: Mapping[str, Any], name: str) -> np.ndarray | None:
    return weights.array(w[name]) if name in w else None


def build_block(
    s: Mamba2Spec,
    c: CommonConfig,
    w: Mapping[str, Any],
    weights: Weights,
    index: int,
    model: Mapping[str, Any],
) -> Mamba2Block:
    return Mamba2Block(s, c, w, weights)
