"""The generalized delta rule in DPLR form (RWKV-7's time mix) on a CUDA device: `dplr_chunks`,
called as the Numba kernel's `dplr_chunks` (ops/dplr/numba.py) is, running the kernel of
`cupy_kernels.py`.

q, k, a, b, log_w [T, H, d_k] and v [T, H, d_v] in one dtype (float32, float64, or bfloat16,
widened to float32 in registers), token-major as the model's projections give them; the state
s [H, d_k, d_v] in float32 or float64, updated in place.  NumPy arrays are copied to the device
and back; the launcher's own arrays stay where they are (copied once to C order if strided).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.cuda import (
    Launcher,
    common_kind,
    compute_dtype,
    cupy_launcher,
    finish,
    fit_chunk,
    on_launcher,
    put_state_back,
    set_shared_bytes,
    state_dtype,
)
from linstream.ops.decay.cupy_kernels import NT, VALUE_TILE

from . import cupy_kernels as dk_
from .constants import DEFAULT_DPLR_CHUNK, SPAN

__all__ = ["dplr_chunks"]


def dplr_chunks(
    q: Any,
    k: Any,
    v: Any,
    a: Any,
    b: Any,
    log_w: Any,
    s: Any,
    *,
    chunk_size: int = DEFAULT_DPLR_CHUNK,
    launcher: Launcher | None = None,
) -> Any:
    """Returns out [T, H, d_v] in the compute dtype (a NumPy array when q is one); s is updated
    in place.  See the module docstring."""
    lau = launcher if launcher is not None else cupy_launcher()
    xp = lau.xp
    kind = common_kind({"q": q, "k": k, "v": v, "a": a, "b": b, "log_w": log_w})
    real = compute_dtype((kind,))
    sdt = state_dtype("s", s)
    t, h, dk = (int(n) for n in q.shape)
    dv = int(v.shape[2])
    out = xp.empty((t, h, dv), dtype=real)
    if t > 0:
        args_in = [on_launcher(lau, x, kind) for x in (q, k, v, a, b, log_w)]
        sd = on_launcher(lau, s)

        def smem(c: int) -> int:
            return dk_.dplr_shared_bytes(c, dk, real.itemsize)

        c = fit_chunk(min(int(chunk_size), t), smem, lau.max_shared_bytes(), "dplr_chunks")
        kern = lau.kernel(dk_.dplr_source(kind, real.name, sdt.name), "dplr_chunks")
        set_shared_bytes(kern, smem(c))
        grid = (max(1, -(-dv // VALUE_TILE)), h)
        args = (*args_in, sd, out, np.int64(t), np.int32(h), np.int32(dk), np.int32(dv),
                np.int32(c), np.int32(VALUE_TILE), np.float64(SPAN[real]))  # fmt: skip
        kern(grid, (NT,), args, shared_mem=smem(c))
        put_state_back(lau, s, sd)
    return finish(lau, q, out)
