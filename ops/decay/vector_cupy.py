"""The vector-gated rule on a CUDA device: `vector_gated_chunks`, called as the Numba kernel's
`vector_gated_chunks` (ops/decay/vector_numba.py) is, running the kernel of
`vector_cupy_kernels.py`.

Inputs are head-major, one dtype (float32, float64, or bfloat16, widened to float32 in
registers): qh, kh, gh [H, T, d_k] (q already scaled, gh the log gates ≤ 0), vh [H, T, d_v]; the
state s [H, d_k, d_v] in float32 or float64, updated in place.  NumPy arrays are copied to the
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
from linstream.ops.decay.constants import DEFAULT_VECTOR_CHUNK

from . import cupy_kernels as ck
from . import vector_cupy_kernels as vk

__all__ = ["vector_gated_chunks"]


def vector_gated_chunks(
    qh: Any,
    kh: Any,
    vh: Any,
    gh: Any,
    s: Any,
    *,
    chunk_size: int = DEFAULT_VECTOR_CHUNK,
    launcher: Launcher | None = None,
) -> Any:
    """Returns out [H, T, d_v] in the compute dtype (a NumPy array when qh is one); s is
    updated in place.  See the module docstring."""
    lau = launcher if launcher is not None else cupy_launcher()
    xp = lau.xp
    kind = common_kind({"qh": qh, "kh": kh, "vh": vh, "gh": gh})
    real = compute_dtype((kind,))
    sdt = state_dtype("s", s)
    h, t, f = (int(n) for n in qh.shape)
    dv = int(vh.shape[2])
    out = xp.empty((h, t, dv), dtype=real)
    if t > 0:
        q, k, v, g = (on_launcher(lau, x, kind) for x in (qh, kh, vh, gh))
        sd = on_launcher(lau, s)

        def smem(c: int) -> int:
            return vk.vector_shared_bytes(c, f, real.itemsize)

        what = "vector_gated_chunks"
        c = fit_chunk(min(int(chunk_size), t), smem, lau.max_shared_bytes(), what)
        kern = lau.kernel(vk.vector_source(kind, real.name, sdt.name), what)
        set_shared_bytes(kern, smem(c))
        grid = (max(1, -(-dv // ck.VALUE_TILE)), h)
        args = (q, k, v, g, sd, out, np.int64(t), np.int32(f), np.int32(dv), np.int32(c),
                np.int32(ck.VALUE_TILE))  # fmt: skip
        kern(grid, (ck.NT,), args, shared_mem=smem(c))
        put_state_back(lau, s, sd)
    return finish(lau, qh, out)
