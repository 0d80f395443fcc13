"""The decaying rules (decay, gated) on a CUDA device: `decay_chunks`, called as the Numba
kernel's `decay_chunks` (ops/decay/numba.py) is, running the kernel of `cupy_kernels.py`.

Inputs are head-major as for the Numba kernel (ops/rules/gather.py): qh, kh [H, T, F] mapped,
vh [H, T, d_v + 1] with a ones column, one dtype (float32, float64, or bfloat16, widened to
float32 in registers); the state sx [H, F, d_v + 1] (S, then z) in float32 or float64, updated in
place; log_gate, eps_t [H, T].  Arrays may be NumPy (copied to the device and back) or the
launcher's own (CuPy: nothing leaves the device).  The chunk math runs in float32 (float64 for
float64 inputs), the state is carried in its own dtype, the ratio is formed in float64.
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
from linstream.ops.decay.constants import DEFAULT_RULE_CHUNK, LOG_GATE_FLOOR

from . import cupy_kernels as ck

__all__ = ["decay_chunks"]


def decay_chunks(
    qh: Any,
    kh: Any,
    vh: Any,
    sx: Any,
    log_gate: Any,
    eps_t: Any,
    *,
    normalize: bool,
    chunk_size: int = DEFAULT_RULE_CHUNK,
    launcher: Launcher | None = None,
) -> Any:
    """Returns out [H, T, d_v] in the compute dtype (a NumPy array when qh is one); sx is
    updated in place.  See the module docstring."""
    lau = launcher if launcher is not None else cupy_launcher()
    xp = lau.xp
    kind = common_kind({"qh": qh, "kh": kh, "vh": vh})
    real = compute_dtype((kind,))
    sdt = state_dtype("sx", sx)
    h, t, f = (int(n) for n in qh.shape)
    dv = int(vh.shape[2]) - 1
    out = xp.empty((h, t, dv), dtype=real)
    if t > 0:
        q, k, v = (on_launcher(lau, x, kind) for x in (qh, kh, vh))
        sd = on_launcher(lau, sx)
        z0 = sd[:, :, dv].copy()  # a copy always (ascontiguousarray returns a view when F = 1)
        lg = xp.maximum(on_launcher(lau, log_gate, dtype=np.float64), LOG_GATE_FLOOR)
        et = on_launcher(lau, eps_t, dtype=np.float64)

        def smem(c: int) -> int:
            return ck.decay_shared_bytes(c, f, real.itemsize, sdt.itemsize)

        c = fit_chunk(min(int(chunk_size), t), smem, lau.max_shared_bytes(), "decay_chunks")
        kern = lau.kernel(ck.decay_source(kind, real.name, sdt.name), "decay_chunks")
        set_shared_bytes(kern, smem(c))
        grid = (max(1, -(-dv // ck.VALUE_TILE)), h)
        args = (q, k, v, sd, z0, lg, et, out, np.int64(t), np.int32(f), np.int32(dv),
                np.int32(c), np.int32(ck.VALUE_TILE), np.int32(bool(normalize)))  # fmt: skip
        kern(grid, (ck.NT,), args, shared_mem=smem(c))
        put_state_back(lau, sx, sd)
    return finish(lau, qh, out)
