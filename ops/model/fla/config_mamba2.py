"""Mamba-2's config.json in its two dialects: Hugging Face transformers 5.24's `Mamba2Config`
and fla 0.6.0's, each read with its own library's defaults.

    common = parse_common(reader)      # the widths, depth, vocabulary, eps (CommonConfig)
    spec = parse(reader, common)       # the layer's settings (Mamba2Spec)

Both libraries write model_type "mamba2" and the same tensor names; fla's config is told apart
by a key only it defines (`FLA_ONLY`: norm_eps, dt_limit, rmsnorm, D_has_hdim, ...); a config
with keys of both is refused, one with neither is read as transformers'.  A key its library
does not define is refused by name, as are the values the runtime does not implement:

- an activation other than SiLU (`hidden_act`: the convolution's, and fla's gate without the
  norm);
- in transformers' dialect, `norm_before_gate` true or `rms_norm` false (keys of transformers'
  4.x Mamba-2 that 5.24 no longer defines and never honoured: its gated norm always gates
  first; a checkpoint trained otherwise would not be the model transformers runs);
- shapes that do not fit: hidden · expand ≠ num_heads · head_dim, num_heads not a multiple of
  n_groups, a time-step limit that is not two numbers lo ≤ hi.

Keys that change nothing in a forward are accepted: initialization (time_step_min/max/floor,
time_step_rank, rescale_prenorm_residual, A_init_range, dt_min/max/init_floor, conv_init),
`chunk_size` (the libraries' scan chunk: only rounding depends on it; linstream's kernel has
its own), `residual_in_fp32` (keeps the residual stream in float32 when the model runs in 16
bits; here it is always float32 or float64), fla's `fuse_norm` (fused or torch RMSNorm: the
same function) and the output head's `tie_word_embeddings`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .config import CommonConfig, ConfigReader

__all__ = ["FLA_ONLY", "TRANSFORMERS_ONLY", "Mamba2Spec", "dialect", "parse", "parse_common"]

#: keys only fla 0.6.0's Mamba2Config defines, and only transformers 5.24's
FLA_ONLY = (
    "norm_eps",
    "dt_limit",
    "rmsnorm",
    "D_has_hdim",
    "A_init_range",
    "dt_min",
    "dt_max",
    "dt_init_floor",
    "conv_init",
    "fuse_norm",
)
TRANSFORMERS_ONLY = (
    "layer_norm_epsilon",
    "time_step_limit",
    "time_step_min",
    "time_step_max",
    "time_step_floor",
    "time_step_rank",
)
_ACTIVATIONS = ("silu", "swish")
_LIBRARY = {"transformers": "transformers 5.24's Mamba2Config", "fla": "fla 0.6.0's Mamba2Config"}


@dataclass(frozen=True)
class Mamba2Spec:
    """A Mamba-2 layer's settings (every layer the same).  gated_norm: a mode of
    `mamba2_passes.GATED_NORM_MODES`; d_has_hdim: D per channel [I] rather than per head."""

    dialect: str
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    use_conv_bias: bool
    use_bias: bool
    time_step_limit: tuple[float, float]
    gated_norm: str
    d_has_hdim: bool


def dialect(r: ConfigReader) -> str:
    """The dialect, "fla" or "transformers" (see the module docstring)."""
    fla = [k for k in FLA_ONLY if k in r.raw]
    hf = [k for k in TRANSFORMERS_ONLY if k in r.raw]
    if fla and hf:
        r.fail(
            f"config.json mixes transformers' Mamba-2 keys ({hf[0]}) with fla's ({fla[0]}); "
            "expected the config of one library"
        )
    return "fla" if fla else "transformers"


def parse_common(r: ConfigReader) -> CommonConfig:
    fla = dialect(r) == "fla"
    hidden = r.get("hidden_size", 2048 if fla else 4096, "pos_int")
    layers = r.get("num_hidden_layers", 48 if fla else 64, "pos_int")
    vocab = r.get("vocab_size", 32000 if fla else 32768, "pos_int")
    eps = r.get("norm_eps" if fla else "layer_norm_epsilon", 1e-5, "pos_float")
    expand = r.get("expand", 2, "pos_float")
    act = r.get("hidden_act", "silu", "str")
    r.require("hidden_act", act, _ACTIVATIONS, "Mamba-2 runs with SiLU ('silu' or 'swish') only")
    return CommonConfig(r.family, hidden, layers, vocab, eps, int(expand * hidden))


def parse(r: ConfigReader, c: CommonConfig) -> Mamba2Spec:
    kind = dialect(r)
    fla = kind == "fla"
    inner = c.intermediate_size
    head_dim = r.get("head_dim", 64, "pos_int")
    heads = r.get("num_heads", inner // head_dim if fla else 128, "pos_int")
    if heads * head_dim != inner:
        r.refuse(
            "num_heads",
            heads,
            f"num_heads · head_dim = {heads * head_dim} must equal hidden_size · expand = {inner}",
        )
    groups = r.get("n_groups", 1 if fla else 8, "pos_int")
    if heads % groups:
        r.refuse("n_groups", groups, f"num_heads ({heads}) must be a multiple of n_groups")
    limit = _limit(r, "dt_limit" if fla else "time_step_limit")
    if fla:
        rms = r.get("rmsnorm", True, "bool")
        before = r.get("norm_before_gate", False, "bool")
        mode = "gate" if not rms else "norm_then_gate" if before else "gate_then_norm"
        d_has_hdim = r.get("D_has_hdim", False, "bool")
        for key in ("dt_min", "dt_max", "dt_init_floor"):
            r.get(key, 0.0, "float")  # initialization only
        r.read.update({"A_init_range", "conv_init"})  # initialization only
        r.get("fuse_norm", True, "bool")
    else:
        mode, d_has_hdim = "gate_then_norm", False
        why = (
            "transformers 5.24 does not define it and its Mamba-2 always gates before the norm "
            "(RMS(y · silu(z))); if the checkpoint was trained that way, remove the key"
        )
        r.only_default("norm_before_gate", False, why)
        r.only_default("rms_norm", True, why)
        for key in ("time_step_min", "time_step_max", "time_step_floor"):
            r.get(key, 0.0, "float")  # initialization only
        r.read.add("time_step_rank")  # "auto" or an integer: not used by the forward
    r.get("residual_in_fp32", True, "bool")
    r.get("rescale_prenorm_residual", fla, "bool")  # initialization only
    r.get("chunk_size", 256, "pos_int")
    spec = Mamba2Spec(
        dialect=kind,
        num_heads=heads,
        head_dim=head_dim,
        state_size=r.get("state_size", 128, "pos_int"),
        n_groups=groups,
        conv_kernel=r.get("conv_kernel", 4, "pos_int"),
        use_conv_bias=r.get("use_conv_bias", True, "bool"),
        use_bias=r.get("use_bias", False, "bool"),
        time_step_limit=limit,
        gated_norm=mode,
        d_has_hdim=d_has_hdim,
    )
    unknown = sorted(k for k in r.raw if k not in r.read)
    if unknown:
        key = unknown[0]
        r.refuse(
            key,
            r.raw[key],
            f"not a key of {_LIBRARY[kind]}, so what it does to the forward is unknown",
        )
    return spec


def _number(v: Any) -> float | None:
    """A JSON number, Infinity, or transformers 5's {"__float__": "Infinity"} encoding."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dict) and set(v) == {"__float__"} and isinstance(v["__float__"], str):
        try:
            return float(v["__float__"])
        except ValueError:
            return None
    return None


def _limit(r: ConfigReader, key: str) -> tuple[float, float]:
    """The time-step limit (lo, hi): two numbers, lo ≤ hi, hi possibly infinite."""
    r.read.add(key)
    raw = r.raw.get(key)
    if raw is None:
        return (0.0, math.inf)
    vals = [_number(v) for v in raw] if isinstance(raw, list) else []
    if len(vals) != 2 or any(v is None or math.isnan(v) for v in vals):
        r.fail(f"config option {key} = {json.dumps(raw)}: expected two numbers [lo, hi]")
    lo, hi = float(vals[0] or 0.0), float(vals[1] or 0.0)
    if not lo <= hi:
        r.refuse(key, raw, "expected lo ≤ hi")
    return (lo, hi)
