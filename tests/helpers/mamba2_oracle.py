"""transformers 5.24's Mamba-2 as the outside oracle, on the CPU: its pure-PyTorch path, in
float32 as it runs and in float64 throughout.

    y, s = chunk_scan(x, dt, A, B, C, D=..., dt_bias=..., dt_limit=..., dtype=torch.float64)
    hs = run_mamba2(folder, ids, torch.float64)      # hidden states as linstream numbers them
    ssm, conv = mamba2_cache(folder, ids, torch.float64)   # its cache after the tokens

`chunk_scan` is transformers' `mamba2_chunk_scan` (the reference the hub-kernel wrapper falls
back to without `mamba_ssm`: the SSD of Mamba2Mixer's torch path).

transformers' torch path does not honour float64 throughout: `mamba2_chunk_scan` casts x, B, C
with `.float()`, Mamba2Mixer takes A as `A_log.float()`, both RMSNorms (`Mamba2RMSNorm`,
`MambaRMSNormGated`) compute in float32, and Mamba2Block casts the residual to float32 when
`residual_in_fp32` (the default).  `patch_mamba2_float64` makes each of these, for float64
inputs only, a float64 clone of transformers' own source (`helpers.fla_oracle`'s `_f64_clone`:
`.float()` and `torch.float32` rewritten to float64), so a float64 model runs transformers'
math in float64 throughout; float32 runs are transformers' code unchanged.

Hidden states: transformers' `output_hidden_states` are the L blocks' outputs then the final
norm of the last; linstream's are the embeddings, the outputs of blocks 0..L−2, then the final
norm.  `run_mamba2` returns linstream's numbering (the embeddings from the model's own table).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from helpers.fla_oracle import _f64_clone
from helpers.rwkv_mamba_models import load_model

__all__ = ["chunk_scan", "mamba2_cache", "patch_mamba2_float64", "run_mamba2"]

_PATCHED: list[str] = []


def _modeling() -> Any:
    import transformers.models.mamba2.modeling_mamba2 as m

    return m


def patch_mamba2_float64() -> list[str]:
    """Rebind the float32-casting pieces (see the module docstring) to dispatch on their input's
    dtype (idempotent); returns what was rebound."""
    if _PATCHED:
        return _PATCHED
    m = _modeling()
    orig_scan = m.mamba2_chunk_scan
    raw_scan = inspect.unwrap(orig_scan)

    def scan(hidden_states, *args, **kwargs):
        fn = _f64_clone(raw_scan) if hidden_states.dtype == torch.float64 else orig_scan
        return fn(hidden_states, *args, **kwargs)

    # `inspect.unwrap` of the rebound name (as `chunk_scan` reads it) gives transformers' own
    # function, not this dispatcher (whose float64 clone would not see `raw_scan`)
    scan.__wrapped__ = raw_scan  # type: ignore[attr-defined]

    m.mamba2_chunk_scan = scan  # Mamba2Mixer.forward reads the module's global at call time
    _PATCHED.append("mamba2_chunk_scan")
    for cls in (m.Mamba2RMSNorm, m.MambaRMSNormGated, m.Mamba2Block, m.Mamba2Mixer):
        orig = cls.forward

        def forward(self, hidden_states, *args, _orig=orig, **kwargs):
            fn = _f64_clone(_orig) if hidden_states.dtype == torch.float64 else _orig
            return fn(self, hidden_states, *args, **kwargs)

        cls.forward = forward
        _PATCHED.append(f"{cls.__name__}.forward")
    return _PATCHED


def _t(a: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=dtype)


@torch.no_grad()
def chunk_scan(
    x: Any,
    dt: Any,
    a: Any,
    b: Any,
    c: Any,
    *,
    d: Any = None,
    dt_bias: Any = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state: Any = None,
    chunk_size: int = 256,
    dtype: torch.dtype = torch.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """transformers' mamba2_chunk_scan on x [T, H, P], dt [T, H], A [H], B, C [T, G, N], D [H],
    dt_bias [H], from state [H, P, N] (None: zeros): (y [T, H, P], final state [H, P, N])."""
    raw = inspect.unwrap(_modeling().mamba2_chunk_scan)
    fn = _f64_clone(raw) if dtype == torch.float64 else raw
    y, s = fn(
        _t(x, dtype)[None],
        _t(dt, dtype)[None],
        _t(a, dtype),
        _t(b, dtype)[None],
        _t(c, dtype)[None],
        chunk_size=chunk_size,
        D=None if d is None else _t(d, dtype),
        dt_bias=None if dt_bias is None else _t(dt_bias, dtype),
        initial_states=None if state is None else _t(state, dtype)[None],
        dt_softplus=True,
        dt_limit=dt_limit,
        return_final_states=True,
    )
    return y[0].numpy(), s[0].numpy()


def _model(folder: Any, dtype: torch.dtype) -> Any:
    patch_mamba2_float64()
    return load_model(folder, "mamba2", dtype=dtype)


@torch.no_grad()
def run_mamba2(folder: Any, ids: Any, dtype: torch.dtype = torch.float32) -> list[np.ndarray]:
    """transformers' whole-sequence forward of the folder's model on ids [T]: L + 1 hidden
    states [T, hidden] in linstream's numbering (see the module docstring)."""
    model = _model(folder, dtype)
    x = torch.as_tensor(np.asarray(ids), dtype=torch.long)[None]
    out = model(x, output_hidden_states=True, use_cache=False)
    hs = [h[0].numpy() for h in out.hidden_states]
    emb = model.backbone.embeddings(x)[0].numpy()
    return [emb, *hs[:-2], hs[-1]]


@torch.no_grad()
def mamba2_cache(
    folder: Any, ids: Any, dtype: torch.dtype = torch.float32
) -> list[tuple[np.ndarray, np.ndarray]]:
    """transformers' cache after a whole-sequence forward on ids, per layer: (the SSM state
    [H, P, N], the convolution state [conv_dim, W], the last W raw inputs, oldest first)."""
    model = _model(folder, dtype)
    x = torch.as_tensor(np.asarray(ids), dtype=torch.long)[None]
    cache = model(x, use_cache=True).cache
    return [
        (
            cache.get_recurrent_state(i, state_idx=0)[0].numpy(),
            cache.get_conv_state(i, state_idx=0)[0].numpy(),
        )
        for i in range(model.config.num_hidden_layers)
    ]
