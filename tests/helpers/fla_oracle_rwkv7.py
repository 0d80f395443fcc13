"""fla's RWKV-7 on the CPU: the Triton entry points its layer and model reach, rebound to fla's
own torch references, on top of the oracle's patch set (`helpers.fla_oracle`).

    patch_rwkv7_for_cpu()          # after it, fla's RWKV7ForCausalLM runs on the CPU

What is rebound (fla 0.6.0) and to what:
- `chunk_rwkv7` and `fused_mul_recurrent_rwkv7` (the layer's two paths, 64 tokens or more and
  fewer) -> `fla.ops.generalized_delta_rule.dplr.naive.dplr_recurrence`, the generalized delta
  rule's naive reference (a = −kk, b = kk·a as the layer passes them to `chunk_rwkv7`).  The
  reference scales q by K^−0.5 itself; RWKV-7 calls with scale 1, so q is multiplied by
  K^0.5 first (8 for K = 64: a power of two, exact);
- `fused_addcmul_rwkv7` -> `torch_addcmul_rwkv7`, `fused_k_rwkv7` -> `k_update_ref`,
  `gate_output_correction` -> `gate_output_correction_ref` (fla's references beside them);
- `token_shift` (layer and channel mix) -> `token_shift_ref` plus the carried last token
  (the kernel's `cache`, [N, D], added to the first row's shifted value);
- `l2_norm` (only with `fuse_norm=True`) -> the oracle's kernel formula;
- `sqrelu_fwd` (a `torch.compile`d function: Inductor would compile C++ at the first call)
  -> relu(x)² in x's dtype (fla's math; the same values in float32).
The norms with `fuse_norm=True` go through the oracle's LayerNorm/GroupNorm stand-ins; with
`fuse_norm=False` they are torch's own.  float64 inputs run `dplr_recurrence`'s float64 clone.
"""

from __future__ import annotations

import torch.nn.functional as F

from helpers.fla_oracle import _l2norm, _need, _pick, _set, patch_fla_for_cpu

__all__ = ["patch_rwkv7_for_cpu"]

_PATCHED = False


def _token_shift(x, cu_seqlens=None, cache=None, output_cache=False, chunk_indices=None):
    """fla.modules.token_shift.token_shift: delta = shifted − x, the shifted first row being
    the previous call's last token (`cache`, [N, D]) or zeros; the new cache is x's last row."""
    from fla.modules.token_shift import token_shift_ref

    _need(cu_seqlens is None, "token_shift with cu_seqlens")
    delta = token_shift_ref(x)
    if cache is not None:
        delta[:, 0] = delta[:, 0] + cache.reshape(x.shape[0], x.shape[2]).to(x.dtype)
    if not output_cache:
        return delta
    return delta, x[:, -1].clone()


def _chunk_rwkv7(
    r,
    w,
    k,
    v,
    a,
    b,
    scale=1.0,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    **kwargs,
):
    """fla.ops.rwkv7.chunk_rwkv7 ([B, T, H, D]; w the log decay; state [N, H, K, V]) ->
    fla's dplr_recurrence ([B, H, T, D])."""
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence

    _need(cu_seqlens is None and kwargs.get("cp_context") is None, "rwkv7 variant")
    dk = r.shape[-1]
    q = r * (scale * dk**0.5)  # the reference multiplies q by dk**-0.5
    fn = _pick(dplr_recurrence, r.dtype)
    o, ht = fn(
        *(t.transpose(1, 2) for t in (q, k, v, a, b, w)),
        initial_state=initial_state,
        output_final_state=output_final_state,
    )
    return o.transpose(1, 2).contiguous(), ht


def _fused_mul_recurrent_rwkv7(
    r,
    w,
    k,
    v,
    kk,
    a,
    scale=1.0,
    initial_state=None,
    output_final_state=False,
    reverse=False,
    cu_seqlens=None,
):
    """fla.ops.rwkv7.fused_mul_recurrent_rwkv7 (the layer's path under 64 tokens): the same
    recurrence with a = −kk, b = kk·a."""
    _need(not reverse, "reverse rwkv7 recurrence")
    if scale is None:
        scale = r.shape[-1] ** -0.5
    return _chunk_rwkv7(
        r, w, k, v, -kk, kk * a, scale, initial_state, output_final_state, cu_seqlens
    )


def _sqrelu(x):
    r = F.relu(x)
    return r * r


def patch_rwkv7_for_cpu() -> None:
    """Install the oracle's patch set and the RWKV-7 rebinding above (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    patch_fla_for_cpu()
    from fla.ops.rwkv7.fused_addcmul import torch_addcmul_rwkv7
    from fla.ops.rwkv7.fused_k_update import k_update_ref
    from fla.ops.rwkv7.gate_output_correction import gate_output_correction_ref

    layer = "fla.layers.rwkv7"
    _set(layer, "token_shift", _token_shift)
    _set("fla.models.rwkv7.modeling_rwkv7", "token_shift", _token_shift)
    _set(layer, "chunk_rwkv7", _chunk_rwkv7)
    _set(layer, "fused_mul_recurrent_rwkv7", _fused_mul_recurrent_rwkv7)
    _set(layer, "fused_addcmul_rwkv7", torch_addcmul_rwkv7)
    _set(
        layer,
        "fused_k_rwkv7",
        lambda k, a, ka, cu_seqlens=None, cu_seqlens_cpu=None: k_update_ref(k, a, ka),
    )
    _set(layer, "gate_output_correction", gate_output_correction_ref)
    _set(layer, "l2_norm", lambda x, eps=1e-6, output_dtype=None, **kw: _l2norm(x, eps))
    _set("fla.modules.activations.ops", "sqrelu_fwd", _sqrelu)
    _PATCHED = True
