"""fla's own Mamba-2 (`fla.models.Mamba2ForCausalLM`) on the CPU, on top of the oracle's patch
set (`helpers.fla_oracle`).

    patch_mamba2_for_cpu()       # after it, fla's Mamba2ForCausalLM runs on the CPU

Without `mamba_ssm` fla's Mamba-2 layer takes its pure-torch path (`Mamba2.torch_forward`);
the one Triton launch left on it is the gated RMSNorm (`fla.modules.norm.layernorm_gated`'s
`rmsnorm_fn`), rebound here to fla's own reference beside it, `rms_norm_ref` (its float64
clone for float64 inputs).  The torch path continues from a cache one token per call, as fla
says ("Mamba2 cached decoding only supports a single new token per step").

Observed on fla 0.6.0's torch path, not used by the tests: with n_groups > 1 its cached
decoding does not reproduce its own whole-sequence forward, and its whole-sequence forward
differs from transformers' Mamba-2 (which linstream matches); with n_groups = 1 the three agree.
"""

from __future__ import annotations

from typing import Any

from helpers.fla_oracle import _pick, _set, patch_fla_for_cpu

__all__ = ["MAMBA2_TINY", "patch_mamba2_for_cpu"]

_PATCHED = False

#: fla's Mamba2Config keyword arguments of a tiny model (one group: see the module docstring)
MAMBA2_TINY: dict[str, Any] = dict(
    hidden_size=64, num_hidden_layers=2, state_size=16, head_dim=16, num_heads=8, expand=2,
    n_groups=1, conv_kernel=4, vocab_size=128, chunk_size=32, tie_word_embeddings=True,
)  # fmt: skip


def _rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """fla.modules.norm.layernorm_gated.rmsnorm_fn -> rms_norm_ref (the same arguments)."""
    from fla.modules.norm.layernorm_gated import rms_norm_ref

    return _pick(rms_norm_ref, x.dtype)(
        x, weight, bias, z=z, eps=eps, group_size=group_size, norm_before_gate=norm_before_gate
    )


def patch_mamba2_for_cpu() -> None:
    """Install the oracle's patch set and the rebinding above (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    patch_fla_for_cpu()
    _set("fla.modules.norm.layernorm_gated", "rmsnorm_fn", _rmsnorm_fn)
    _PATCHED = True
