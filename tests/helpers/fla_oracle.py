"""fla's own model classes as a CPU oracle (flash-linear-attention 0.6.0, pinned in the test
extras): build tiny random models of the five families, save them as Hugging Face folders, and
run fla's forward on the CPU.

fla's layers call Triton kernels, which cannot launch without a GPU.  `patch_fla_for_cpu()`
rebinds the names the layers look up to fla's OWN naive references (`fla/ops/*/naive.py`,
`naive_gdn_gate`, `rms_norm_ref`, `rotary_embedding_ref`) and to plain-torch equivalents of
trivial fused helpers (activations, the depthwise causal conv, the gated norm, l2norm with the
kernel's eps-inside-the-root formula).  The recurrence wrappers only adapt layouts ([B, T, H, D]
and [B, H, T, D]; fla's [H, V, K] cache states and the naive functions' [H, K, V]), expand
grouped value heads and apply the "in-kernel" flags the Triton entry points apply before their
recurrence.  A guard makes any Triton launch raise, so an unpatched path cannot run unnoticed.

float64: fla forces float32 in a few places (the naive references cast to float32; the RetNet
decays, the rotary tables and HGRN2's lower bounds are built in float32).  For float64 inputs
those functions run as float64 clones made at test time by rewriting only the dtype tokens of
fla's own source (`_f64_clone`), so a float64 run is fla's math in float64 throughout; float32
runs use fla's code unchanged.  Nothing of fla's is copied into this repository.

No test downloads anything: models are built from configs, randomized, and saved locally.

(Longer than this project's modules usually are: it is one patch set, about thirty short
stand-ins that must be installed together, plus the tiny configs and the runner that use it.)
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import os
import re
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
warnings.filterwarnings("ignore", message="ShortConvolution is crucial")

__all__ = [
    "PATCH_TARGETS",
    "build_and_save",
    "patch_fla_for_cpu",
    "randomize_",
    "run_fla",
    "tiny_configs",
]

_PATCHED = False
PATCH_TARGETS: list[str] = []  # "module.attr" strings that were rebound
_F64_CACHE: dict[Any, Any] = {}


# -- float64 clones of fla's functions (dtype tokens rewritten, math untouched) -----------------
def _f64_clone(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn with `.float()`, `torch.float32` and `torch.float` rewritten to float64, compiled in fn's
    module globals as they are when first asked for (after the patch, so its rebound names)."""
    if fn in _F64_CACHE:
        return _F64_CACHE[fn]
    inner = inspect.unwrap(fn)  # a decorated function's own source and module globals
    src = textwrap.dedent(inspect.getsource(inner))
    new = src.replace(".float()", ".double()")
    new = re.sub(r"torch\.float32\b", "torch.float64", new)
    new = re.sub(r"torch\.float\b(?!\d)", "torch.float64", new)
    ns = dict(inner.__globals__)
    exec(compile(new, f"<f64 clone of {inner.__module__}.{inner.__qualname__}>", "exec"), ns)
    clone = ns[inner.__name__]
    _F64_CACHE[fn] = clone
    return clone


def _pick(fn: Callable[..., Any], dtype: torch.dtype) -> Callable[..., Any]:
    return _f64_clone(fn) if dtype == torch.float64 else fn


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise NotImplementedError(f"fla oracle: unsupported on the CPU path: {what}")


def _check_scale(scale: Any, k: int) -> None:
    _need(scale is None or abs(scale - k**-0.5) < 1e-12, f"custom scale {scale}")


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The formula of fla.modules.l2norm's kernels: x / sqrt(Σx² + eps)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def _vfirst(state: torch.Tensor | None, state_v_first: bool) -> torch.Tensor | None:
    """[N, H, V, K] <-> [N, H, K, V] (the naive functions use [N, H, K, V])."""
    if state is None or not state_v_first:
        return state
    return state.transpose(-1, -2).contiguous()


# -- recurrences -> fla's naive references ------------------------------------------------------
def _gla_naive(
    q,
    k,
    v,
    g=None,
    gk=None,
    gv=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    reverse=False,
    state_v_first=False,
    cu_seqlens=None,
    **kwargs,
):
    """chunk_gla / fused_recurrent_gla / fused_chunk_gla -> fla.ops.gla.naive.naive_recurrent_gla"""
    from fla.ops.gla.naive import naive_recurrent_gla

    gk = g if g is not None else gk
    _need(cu_seqlens is None and not reverse and gv is None and gk is not None, "gla variant")
    _check_scale(scale, q.shape[-1])
    fn = _pick(naive_recurrent_gla, q.dtype)
    o, ht = fn(
        q,
        k,
        v,
        gk,
        initial_state=_vfirst(initial_state, state_v_first),
        output_final_state=output_final_state,
    )
    return o, _vfirst(ht, state_v_first)


def _simple_gla_naive(
    q,
    k,
    v,
    g=None,
    g_gamma=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    reverse=False,
    state_v_first=False,
    cu_seqlens=None,
    **kwargs,
):
    """the simple_gla calls inside fla.ops.retention.* (whose wrappers build RetNet's decays)
    -> fla.ops.simple_gla.naive.naive_recurrent_simple_gla"""
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    _need(cu_seqlens is None and not reverse, "simple_gla variant")
    b, t, h, _ = q.shape
    if g is None:
        _need(g_gamma is not None, "neither g nor g_gamma")
        g = g_gamma[None, None, :].expand(b, t, h)
    fn = _pick(naive_recurrent_simple_gla, q.dtype)
    o, ht = fn(
        q,
        k,
        v,
        g,
        scale=scale,
        initial_state=_vfirst(initial_state, state_v_first),
        output_final_state=output_final_state,
    )
    return o, _vfirst(ht if output_final_state else None, state_v_first)


def _parallel_simple_gla_naive(
    q, k, v, g=None, g_gamma=None, scale=None, cu_seqlens=None, **kwargs
):
    o, _ = _simple_gla_naive(q, k, v, g=g, g_gamma=g_gamma, scale=scale, cu_seqlens=cu_seqlens)
    return o, None


def _delta_rule_naive(
    q,
    k,
    v,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    **kwargs,
):
    """chunk_delta_rule / fused_recurrent_delta_rule -> fla's naive delta_rule_recurrence
    (state [N, H, K, V]; DeltaNet passes no state_v_first)"""
    from fla.ops.delta_rule.naive import delta_rule_recurrence

    _need(cu_seqlens is None and not kwargs.get("state_v_first", False), "delta variant")
    _check_scale(scale, q.shape[-1])
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    if beta is None:
        beta = torch.ones_like(q[..., 0])
    fn = _pick(delta_rule_recurrence, q.dtype)
    o, ht = fn(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        beta.transpose(1, 2),
        initial_state=initial_state,
        output_final_state=output_final_state,
    )
    return o.transpose(1, 2).contiguous(), ht


def _gated_delta_rule_naive(
    q,
    k,
    v,
    g=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    gk=None,
    gv=None,
    **kwargs,
):
    """chunk_gated_delta_rule / fused_recurrent_gated_delta_rule -> naive_gdn_gate +
    fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule"""
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    _need(cu_seqlens is None and gk is None and gv is None and g is not None, "gdn variant")
    dtype = v.dtype
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    if use_gate_in_kernel:
        g = _pick(naive_gdn_gate, dtype)(g, A_log, dt_bias, output_dtype=dtype)
    if beta is None:
        beta = torch.ones_like(v[..., 0])
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid()
        if allow_neg_eigval:
            beta = beta * 2
    else:
        _need(not allow_neg_eigval, "allow_neg_eigval without the in-kernel sigmoid")
    h, hv = q.shape[2], v.shape[2]
    if hv != h:  # grouped values: value head i reads q/k head i // (HV // H) (the kernel's i_h)
        q = q.repeat_interleave(hv // h, dim=2)
        k = k.repeat_interleave(hv // h, dim=2)
    fn = _pick(naive_recurrent_gated_delta_rule, dtype)
    o, ht = fn(
        q,
        k,
        v,
        beta,
        g,
        scale=scale,
        initial_state=_vfirst(initial_state, state_v_first),
        output_final_state=output_final_state,
    )
    return o.to(dtype), _vfirst(ht, state_v_first)


def _retention(name: str) -> Callable[..., Any]:
    """fla's retention wrapper `name` (it builds RetNet's decays in float32), or its float64
    clone for float64 inputs."""
    orig = getattr(importlib.import_module(f"fla.ops.retention.{name}"), f"{name}_retention")

    def run(q, *args, **kwargs):
        return _pick(orig, q.dtype)(q, *args, **kwargs)

    return run


# -- fused helpers -> fla's references / torch --------------------------------------------------
def _norm_ref(x, weight, bias, residual, eps, prenorm, is_rms_norm, num_groups=1):
    from fla.modules.norm.layernorm import group_norm_ref, layer_norm_ref, rms_norm_ref

    if weight is None:
        weight = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    if num_groups != 1:
        return group_norm_ref(
            x,
            weight,
            bias,
            num_groups,
            residual=residual,
            eps=eps,
            is_rms_norm=is_rms_norm,
            prenorm=prenorm,
        )
    ref = rms_norm_ref if is_rms_norm else layer_norm_ref
    return ref(x, weight, bias, residual=residual, eps=eps, prenorm=prenorm, upcast=False)


class _LayerNormFunction:
    """for fla.modules.norm.layernorm.LayerNormFunction (RMSNorm / LayerNorm / GroupNorm)"""

    @staticmethod
    def apply(
        x,
        weight,
        bias,
        residual=None,
        eps=1e-5,
        prenorm=False,
        residual_in_fp32=False,
        is_rms_norm=False,
        num_groups=1,
    ):
        return _norm_ref(x, weight, bias, residual, eps, prenorm, is_rms_norm, num_groups)


class _LayerNormLinearFunction:
    """for fla.modules.norm.layernorm.LayerNormLinearFunction (rms_norm_linear: HGRN2's output)"""

    @staticmethod
    def apply(
        x,
        norm_weight,
        norm_bias,
        linear_weight,
        linear_bias,
        residual=None,
        eps=1e-5,
        prenorm=False,
        residual_in_fp32=False,
        is_rms_norm=False,
        num_groups=1,
    ):
        y = _norm_ref(x, norm_weight, norm_bias, residual, eps, prenorm, is_rms_norm, num_groups)
        y, res = y if prenorm else (y, None)
        out = F.linear(y.to(linear_weight.dtype), linear_weight, linear_bias)
        return (out, res) if prenorm else out


def _gate_act(g: torch.Tensor, activation: str) -> torch.Tensor:
    if activation in ("swish", "silu"):
        return F.silu(g)
    _need(activation == "sigmoid", f"gate activation {activation}")
    return torch.sigmoid(g)


class _LayerNormGatedFunction:
    """for fla.modules.norm.fused_norm_gate.LayerNormGatedFunction (FusedRMSNormGated):
    norm(x) · weight (+ bias), times act(g)"""

    @staticmethod
    def apply(
        x,
        g,
        weight,
        bias,
        activation="swish",
        residual=None,
        eps=1e-6,
        prenorm=False,
        residual_in_fp32=False,
        is_rms_norm=False,
    ):
        y = _norm_ref(x, weight, bias, residual, eps, prenorm, is_rms_norm)
        y, res = y if prenorm else (y, None)
        out = (y * _gate_act(g.to(y.dtype), activation)).to(x.dtype)
        return (out, res) if prenorm else out


def _rotary_embedding(
    x,
    cos,
    sin,
    interleaved=False,
    inplace=False,
    seqlen_offsets=0,
    cu_seqlens=None,
    chunk_indices=None,
):
    """fla.modules.rotary.ops.rotary_embedding -> rotary_embedding_ref on the rows
    [offset, offset + T) of fla's own cos/sin tables"""
    from fla.modules.rotary.ops import rotary_embedding_ref

    _need(cu_seqlens is None and isinstance(seqlen_offsets, int), "rotary variant")
    t = x.shape[1]
    c, s = cos[seqlen_offsets : seqlen_offsets + t], sin[seqlen_offsets : seqlen_offsets + t]
    return rotary_embedding_ref(x, c, s, interleaved=interleaved).to(x.dtype)


def _rotary_cache_update() -> Callable[..., Any]:
    """RotaryEmbedding._update_cos_sin_cache: fla's own for float32; for float64 its clone, with
    the inverse frequencies recomputed by the clone of `_compute_inv_freq`."""
    from fla.modules.rotary.ops import RotaryEmbedding

    orig = RotaryEmbedding._update_cos_sin_cache
    inv = RotaryEmbedding._compute_inv_freq

    def update(self, seqlen, device=None, dtype=None):
        if dtype != torch.float64:
            return orig(self, seqlen, device=device, dtype=dtype)
        if self.inv_freq.dtype != torch.float64 or not getattr(self, "_f64_inv", False):
            self.inv_freq = _f64_clone(inv)(self, device=device)
            self._f64_inv = True
            self._cos_cached = None  # tables built from the float32 frequencies go
        return _f64_clone(orig)(self, seqlen, device=device, dtype=dtype)

    return update


def _hgrn2_forward() -> Callable[..., Any]:
    """HGRN2Model.forward: its lower bounds are a float32 softmax; float64 clone for float64."""
    from fla.models.hgrn2.modeling_hgrn2 import HGRN2Model

    orig = HGRN2Model.forward

    def forward(self, *args, **kwargs):
        return _pick(orig, self.embeddings.weight.dtype)(self, *args, **kwargs)

    return forward


def _causal_conv1d(
    x,
    weight=None,
    bias=None,
    residual=None,
    initial_state=None,
    output_final_state=False,
    activation=None,
    backend=None,
    cu_seqlens=None,
    **kwargs,
):
    """fla.modules.causal_conv1d.ops.causal_conv1d: depthwise causal conv of width W (weight
    [D, W]); the cache [N, D, W] holds the last W raw inputs, newest last."""
    _need(cu_seqlens is None and kwargs.get("cp_context") is None, "conv variant")
    b, _, d = x.shape
    w = weight.shape[-1]
    hist = x.new_zeros(b, d, w) if initial_state is None else initial_state.to(x.dtype)
    xt = torch.cat([hist, x.transpose(1, 2)], dim=-1)  # [B, D, W + T]
    y = F.conv1d(
        xt[..., 1:],
        weight.unsqueeze(1).to(x.dtype),
        None if bias is None else bias.to(x.dtype),
        groups=d,
    ).transpose(1, 2)
    if activation in ("silu", "swish"):
        y = F.silu(y)
    else:
        _need(activation is None, f"conv activation {activation}")
    if residual is not None:
        y = y + residual
    return y, (xt[..., -w:].contiguous() if output_final_state else None)


def _causal_conv1d_update(
    x, cache, residual=None, weight=None, bias=None, activation=None, **kwargs
):
    """fla.modules.causal_conv1d.ops.causal_conv1d_update: one token, the cache updated in place"""
    shape = x.shape
    x2 = x.reshape(cache.shape[0], cache.shape[1])
    new = torch.cat([cache[..., 1:], x2.unsqueeze(-1).to(cache.dtype)], dim=-1)
    y = (new.to(x.dtype) * weight.to(x.dtype)).sum(-1)
    if bias is not None:
        y = y + bias
    if activation in ("silu", "swish"):
        y = F.silu(y)
    if residual is not None:
        y = y + residual.reshape_as(y)
    cache.copy_(new)
    return y.reshape(shape), cache


def _install_triton_guard() -> None:
    import triton.runtime.jit as tjit

    def blocked(self, grid):
        name = getattr(self, "__name__", None) or getattr(getattr(self, "fn", None), "__name__", "")
        raise RuntimeError(f"fla oracle: Triton kernel {name or self!r} launched on the CPU")

    tjit.KernelInterface.__getitem__ = blocked


def _set(modname: str, attr: str, value: Any) -> None:
    mod = importlib.import_module(modname)
    _need(hasattr(mod, attr), f"{modname}.{attr} missing (a different fla version?)")
    setattr(mod, attr, value)
    PATCH_TARGETS.append(f"{modname}.{attr}")


def patch_fla_for_cpu() -> list[str]:
    """Rebind fla 0.6.0's kernel entry points (idempotent); returns the targets."""
    global _PATCHED
    if _PATCHED:
        return PATCH_TARGETS
    import fla  # registers the Auto* classes
    import fla.layers
    import fla.models
    from fla.models.hgrn2.modeling_hgrn2 import HGRN2Model
    from fla.modules.rotary.ops import RotaryEmbedding

    assert fla.__version__ == "0.6.0", (
        f"the oracle is written against fla 0.6.0, got {fla.__version__}"
    )
    for layer in ("fla.layers.gla", "fla.layers.hgrn2"):
        for name in ("chunk_gla", "fused_recurrent_gla", "fused_chunk_gla"):
            _set(layer, name, _gla_naive)
    _set("fla.ops.retention.chunk", "chunk_simple_gla", _simple_gla_naive)
    _set("fla.ops.retention.fused_chunk", "fused_chunk_simple_gla", _simple_gla_naive)
    _set("fla.ops.retention.fused_recurrent", "fused_recurrent_simple_gla", _simple_gla_naive)
    _set("fla.ops.retention.parallel", "parallel_simple_gla", _parallel_simple_gla_naive)
    for name in ("chunk", "fused_chunk", "fused_recurrent", "parallel"):
        _set("fla.layers.multiscale_retention", f"{name}_retention", _retention(name))
    _set("fla.layers.delta_net", "chunk_delta_rule", _delta_rule_naive)
    _set("fla.layers.delta_net", "fused_recurrent_delta_rule", _delta_rule_naive)
    _set("fla.layers.gated_deltanet", "chunk_gated_delta_rule", _gated_delta_rule_naive)
    _set("fla.layers.gated_deltanet", "fused_recurrent_gated_delta_rule", _gated_delta_rule_naive)
    _set("fla.modules.causal_conv1d.ops", "causal_conv1d", _causal_conv1d)
    _set("fla.modules.causal_conv1d.ops", "causal_conv1d_update", _causal_conv1d_update)
    _set("fla.layers.gated_deltanet", "causal_conv1d", _causal_conv1d)
    _set("fla.modules.norm.layernorm", "LayerNormFunction", _LayerNormFunction)
    _set("fla.modules.norm.layernorm", "LayerNormLinearFunction", _LayerNormLinearFunction)
    _set("fla.modules.norm.fused_norm_gate", "LayerNormGatedFunction", _LayerNormGatedFunction)
    _set("fla.modules.rotary.ops", "rotary_embedding", _rotary_embedding)
    act = "fla.modules.activations.ops"
    _set(act, "swish_fwd", lambda x, output_contiguous=False, **kw: F.silu(x))
    _set(act, "sigmoid_fwd", lambda x, output_contiguous=False, **kw: torch.sigmoid(x))
    _set(
        act,
        "logsigmoid_fwd",
        lambda x, temperature=1.0, output_contiguous=False, **kw: F.logsigmoid(x) / temperature,
    )
    _set(act, "swiglu_fwd", lambda x, y, output_contiguous=False, **kw: F.silu(x) * y)
    RotaryEmbedding._update_cos_sin_cache = _rotary_cache_update()
    HGRN2Model.forward = _hgrn2_forward()
    PATCH_TARGETS.extend(["RotaryEmbedding._update_cos_sin_cache", "HGRN2Model.forward"])
    _install_triton_guard()
    _PATCHED = True
    return PATCH_TARGETS


# -- models ---------------------------------------------------------------------------------------
def tiny_configs() -> dict[str, Any]:
    """Tiny configurations covering every option the runtime implements (vocab 128, hidden 64,
    2 layers)."""
    patch_fla_for_cpu()
    from fla.models import DeltaNetConfig, GatedDeltaNetConfig, GLAConfig, HGRN2Config, RetNetConfig

    common = dict(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    return {
        # grouped heads (4 query heads, 2 key/value heads), short conv, fused norm + swish gate
        "gla": GLAConfig(
            num_heads=4,
            num_kv_heads=2,
            expand_k=0.5,
            expand_v=1.0,
            use_short_conv=True,
            conv_size=4,
            **common,
        ),
        # unfused norm, a feature map, clamp_min, no conv
        "gla_plain": GLAConfig(
            num_heads=2,
            expand_k=0.5,
            expand_v=1.0,
            use_short_conv=False,
            fuse_norm=False,
            fuse_swiglu=False,
            feature_map="relu",
            clamp_min=-0.5,
            **common,
        ),
        "retnet": RetNetConfig(num_heads=4, num_kv_heads=2, expand_k=1.0, expand_v=2.0, **common),
        "delta_net": DeltaNetConfig(
            num_heads=4, expand_k=1.0, expand_v=1.0, use_short_conv=True, conv_size=4, **common
        ),
        # output gate, β × 2, a conv of width 3
        "delta_net_gate_neg": DeltaNetConfig(
            num_heads=4, use_gate=True, allow_neg_eigval=True, conv_size=3, **common
        ),
        "gated_deltanet": GatedDeltaNetConfig(
            head_dim=16, num_heads=4, expand_v=2.0, use_short_conv=True, conv_size=4, **common
        ),
        # grouped values (2 q/k heads, 4 value heads), β × 2, sigmoid output gate
        "gated_deltanet_gva": GatedDeltaNetConfig(
            head_dim=16,
            num_heads=2,
            num_v_heads=4,
            expand_v=1.0,
            allow_neg_eigval=True,
            output_gate_activation="sigmoid",
            **common,
        ),
        "hgrn2": HGRN2Config(
            expand_ratio=16, use_short_conv=True, conv_size=4, use_lower_bound=True, **common
        ),
        "hgrn2_noconv": HGRN2Config(num_heads=2, expand_ratio=None, use_short_conv=False, **common),
        # the remaining switches: no output gates, no norm weights, other q/k maps and norms
        "gla_nogate": GLAConfig(
            num_heads=2,
            use_output_gate=False,
            elementwise_affine=False,
            feature_map="sigmoid",
            **common,
        ),
        "retnet_plain": RetNetConfig(
            num_heads=2, use_output_gate=False, fuse_norm=False, feature_map="silu", **common
        ),
        "delta_net_plain": DeltaNetConfig(
            num_heads=2,
            use_short_conv=False,
            qk_activation="relu",
            qk_norm="sum",
            use_beta=False,
            **common,
        ),
        "gated_deltanet_plain": GatedDeltaNetConfig(
            head_dim=16, num_heads=2, expand_v=1.0, use_gate=False, use_short_conv=False, **common
        ),
    }


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter made non-trivial (norm weights != 1, biases != 0, A_log, dt_bias and
    lower bounds random), so that a mistake about any tensor shows.  Deterministic."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        parent = name.split(".")[-2] if "." in name else ""
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 15 + 1))
        elif name.endswith("dt_bias"):
            p.copy_(r * 0.5 - 1.0)
        elif "lower_bounds" in name:
            p.copy_(r)
        elif "norm" in parent:
            p.copy_(1.0 + 0.2 * r)
        elif name.endswith("embeddings.weight"):
            p.copy_(r)
        elif p.dim() >= 2:
            fan_in = p.shape[-1] if p.dim() == 2 else p[0].numel()
            p.copy_(r / fan_in**0.5)
        else:
            p.copy_(0.3 * r)
    return model


def build_and_save(
    name: str,
    config: Any,
    root: str | os.PathLike[str],
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **save_kwargs: Any,
) -> Path:
    """Build fla's model for config, randomize it, save it under root/name; returns the folder.
    dtype: the stored weights' dtype (torch.bfloat16 as the published checkpoints are)."""
    from transformers import AutoModelForCausalLM

    patch_fla_for_cpu()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    folder = Path(root) / name
    model.to(dtype).save_pretrained(folder, **save_kwargs)
    return folder


@torch.no_grad()
def run_fla(
    folder: str | os.PathLike[str],
    ids: Any,
    dtype: torch.dtype = torch.float64,
    splits: list[int] | None = None,
    return_cache: bool = False,
    linear_inputs: torch.dtype | None = None,
) -> Any:
    """fla's hidden states for token ids [T]: a list of L + 1 arrays [T, hidden] as NumPy
    (the embeddings, the outputs of blocks 0..L-2, the final norm of block L-1's output).
    splits: e.g. [37, 38] runs the pieces [0:37], [37:38], [38:T] through fla's own Cache.
    return_cache: also return fla's cache after the last piece.  linear_inputs: round the input
    of every matrix product (`torch.nn.functional.linear`, which fla's projections, gates and
    MLPs call, fused or not) to this dtype and back (torch.bfloat16: round to nearest even),
    the rest of the forward in `dtype`."""
    from transformers import AutoModelForCausalLM

    patch_fla_for_cpu()
    if linear_inputs is not None:
        linear = F.linear

        def rounded(input: Any, weight: Any, bias: Any = None) -> Any:
            return linear(input.to(linear_inputs).to(input.dtype), weight, bias)

        F.linear = rounded
        try:
            return run_fla(folder, ids, dtype, splits, return_cache)
        finally:
            F.linear = linear
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model = model.to(dtype).eval()
    x = torch.as_tensor(ids, dtype=torch.long)[None]
    t = x.shape[1]
    bounds = [0, *(splits or []), t]
    cache, pieces = None, []
    for a, b in itertools.pairwise(bounds):
        use_cache = bool(splits) or return_cache
        out = model(
            x[:, a:b], past_key_values=cache, use_cache=use_cache, output_hidden_states=True
        )
        cache = out.past_key_values if use_cache else None
        pieces.append([h[0].clone() for h in out.hidden_states])
    hs = [torch.cat([p[i] for p in pieces], dim=0).numpy() for i in range(len(pieces[0]))]
    return (hs, cache) if return_cache else hs
