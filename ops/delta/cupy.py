"""The delta rules (delta, gated_delta) on a CUDA device: `delta_chunks`, called as the Numba
kernel's `delta_chunks` (ops/delta/numba.py) is, running the kernel of `cupy_kernels.py`.

Inputs are head-major, one dtype (float32, float64, or bfloat16, widened to float32 in
registers): qh [H, T, F], kh [H, T, F] unit keys, vh [H, T, d_v]; the state s [H, F, d_v] in
float32 or float64, updated in place; log_gate, beta [H, T].  NumPy arrays are copied to the
device and back; the launcher's own arrays stay where they are.
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
from linstream.ops.decay import cupy_kernels as common
from linstream.ops.decay.constants import DEFAULT_RULE_CHUNK, LOG_GATE_FLOOR

from . import cupy_kernels as dk

__all__ = ["delta_chunks"]


def delta_chunks(
    qh: Any,
    kh: Any,
    vh: Any,
    s: Any,
    log_gate: Any,
    beta: Any,
    *,
    chunk_size: int = DEFAULT_RULE_CHUNK,
    launcher: Launcher | None = None,
) -> Any:
    """Returns out [H, T, d_v] in the compute dtype (a NumPy array when qh is one); s is
    updated in place.  See the module docstring."""
    lau = launcher if launcher is not None else cupy_launcher()
    xp = lau.xp
    kind = common_kind({"qh": qh, "kh": kh, "vh": vh})
    real = compute_dtype((kind,))
    sdt = state_dtype("s", s)
    h, t, f = (int(n) for n in qh.shape)
    dv = int(vh.shape[2])
    out = xp.empty((h, t, dv), dtype=real)
    if t > 0:
        q, k, v = (on_launcher(lau, x, kind) for x in (qh, kh, vh))
        sd = on_launcher(lau, s)
        lg = xp.maximum(on_launcher(lau, log_gate, dtype=np.float64), LOG_GATE_FLOOR)
        bt = on_launcher(lau, beta, dtype=np.float64)

        def smem(c: int) -> int:
            return dk.delta_shared_bytes(c, f, real.itemsize)

        c = fit_chunk(min(int(chunk_size), t), smem, lau.max_shared_bytes(), "delta_chunks")
        kern = lau.kernel(dk.delta_source(kind, real.name, sdt.name), "delta_chunks")
        set_shared_bytes(kern, smem(c))
        grid = (max(1, -(-dv // common.VALUE_TILE)), h)
        args = (q, k, v, sd, lg, bt, out, np.int64(t), np.int32(f), np.int32(dv), np.int32(c),
                np.int32(common.VALUE_TILE))  # fmt: skip
        kern(grid, (common.NT,), args, shared_mem=smem(c))
        put_state_back(lau, s, sd)
    return finish(lau, qh, out)
