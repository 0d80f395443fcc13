"""Mamba-2's SSD rule on a CUDA device: `ssd_chunks`, called as the Numba kernel's `ssd_chunks`
(ops/ssd/numba.py) is, running the kernels of `cupy_kernels.py`.

x [T, H, P], b, c [T, G, N] in one dtype (float32, float64, or bfloat16, widened to float32 in
registers); dt [T, H] the raw time steps (any float dtype), made the time steps by `time_steps`
where dt is (a device array's on the device: no copy to the host and back); a [H], d [H] or
[H, P] (None: no skip), dt_bias [H]; the state [H, P, N] in float32 or float64, updated in
place.  NumPy arrays are copied to the device and back; the launcher's own arrays stay where
they are.
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
    raw_array,
    set_shared_bytes,
    state_dtype,
)
from linstream.ops.decay.cupy_kernels import NT, VALUE_TILE

from . import cupy_kernels as sk
from .constants import DEFAULT_SSD_CHUNK
from .steps import time_steps

__all__ = ["ssd_chunks"]


def ssd_chunks(
    x: Any,
    dt: Any,
    a: Any,
    b: Any,
    c: Any,
    d: Any,
    state: Any,
    *,
    dt_bias: Any = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk_size: int = DEFAULT_SSD_CHUNK,
    launcher: Launcher | None = None,
) -> Any:
    """Returns y [T, H, P] in the compute dtype (a NumPy array when x is one); state is updated
    in place.  See the module docstring."""
    lau = launcher if launcher is not None else cupy_launcher()
    xp = lau.xp
    kind = common_kind({"x": x, "b": b, "c": c})
    real = compute_dtype((kind,))
    sdt = state_dtype("state", state)
    t, h, p = (int(v) for v in x.shape)
    g, n = (int(v) for v in raw_array(b, kind).shape[1:])
    if h % g:
        msg = f"ssd_chunks: expected H a multiple of the groups G of B and C, got H={h}, G={g}"
        raise ValueError(msg)
    out = xp.empty((t, h, p), dtype=real)
    if t > 0:
        xd, bd, cd = (on_launcher(lau, v, kind) for v in (x, b, c))
        bias = np.zeros(h) if dt_bias is None else dt_bias
        where = np if isinstance(dt, np.ndarray) else xp  # a device array's steps: on the device
        steps = on_launcher(lau, time_steps(dt, bias, dt_limit, where))  # [T, H] float64
        # A and D formed where they are: a device's stay there (no copy to the host and back,
        # which would wait for the device's queued work at every layer)
        ad = on_launcher(lau, xp.asarray(a, dtype=xp.float64).reshape(h))
        if d is None:
            dd = xp.zeros((h, p))
        else:
            dd = xp.asarray(d, dtype=xp.float64)
            dd = xp.broadcast_to(dd[:, None] if dd.ndim == 1 else dd, (h, p))
        dv = on_launcher(lau, dd, dtype=real)
        sd = on_launcher(lau, state)
        bad = xp.zeros(t, dtype=np.int32)
        source = sk.ssd_source(kind, real.name, sdt.name)
        flags = lau.kernel(source, "ssd_bad_rows")
        flags((t,), (NT,), (xd, bd, cd, steps, bad, np.int32(h), np.int32(p), np.int32(g),
                            np.int32(n)))  # fmt: skip

        def smem(ch: int) -> int:
            return sk.ssd_shared_bytes(ch, n, real.itemsize)

        ch = fit_chunk(min(int(chunk_size), t), smem, lau.max_shared_bytes(), "ssd_chunks")
        kern = lau.kernel(source, "ssd_chunks")
        set_shared_bytes(kern, smem(ch))
        grid = (max(1, -(-p // VALUE_TILE)), h)
        args = (xd, bd, cd, steps, ad, dv, bad, sd, out, np.int64(t), np.int32(h), np.int32(g),
                np.int32(p), np.int32(n), np.int32(ch), np.int32(VALUE_TILE))  # fmt: skip
        kern(grid, (NT,), args, shared_mem=smem(ch))
        put_state_back(lau, state, sd)
    return finish(lau, x, out)
