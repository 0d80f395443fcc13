"""Cases for the DPLR kernels (RWKV-7's time mix), run the same way on each implementation (the
Numba kernel, the CUDA kernel on a device or on the CPU emulator): random inputs in RWKV-7's form
or a general one, a run over a split into calls with the state carried, and the derived
tolerance against the float64 reference (tests/ops/rules/test_dplr.py, test_dplr_cupy_emu.py,
tests/gpu/gpu_check_rules.py).

Tolerance (derived): an output o_i or a pseudo-value u_i is a sum of at most
n = 2·d_k·(C + 1) + C + T/C products (d_k against the carried state, 2·d_k per in-chunk pair in
the four A matrices, C in the forward substitution, and the T/C chunk contributions the state
carries), each rounding by u (the compute dtype's unit roundoff) relative to the largest term M,
so |Δ| ≤ 4·n·(u_c + u_s)·M with M = max(|q|, 1)·max(|S|, |k|·|v|, |b|·|a|·|S|, |o|) from the
reference run (every decay is ≤ 1, and the rank-1 transitions used here do not expand:
‖diag(w) + b aᵀ‖ ≤ 1, so nothing grows along the chunk).  The state's dtype adds its own u.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["DTYPES", "RWKV_LOWER", "inputs", "run", "tolerance"]

DTYPES = {"f64-state64": (np.float64, np.float64), "f32-state64": (np.float32, np.float64),
          "f32-state32": (np.float32, np.float32)}  # fmt: skip
RWKV_LOWER = -0.6065306597126334  # RWKV-7's decays: w = −e^{-1/2}·sigmoid(·)


def inputs(
    rng: np.random.Generator, t: int, h: int, dk: int, dv: int, form: str = "rwkv"
) -> tuple[np.ndarray, ...]:
    """q, k, v, a, b, log_w [T, H, ·] float64: RWKV-7's form (a = −k̂, b = k̂·α with k̂ a unit
    vector and α in (0, 1), decays in its range) or a general one (a, b random with
    |a|·|b| ≤ 1/2, decays from e^0 down to e^-3)."""
    q, k = rng.standard_normal((2, t, h, dk))
    v = rng.standard_normal((t, h, dv))
    if form == "rwkv":
        kk = rng.standard_normal((t, h, dk))
        kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
        a, b = -kk, kk * rng.random((t, h, dk))
        log_w = RWKV_LOWER * rng.random((t, h, dk))
    else:
        a, b = rng.standard_normal((2, t, h, dk))
        a /= np.linalg.norm(a, axis=-1, keepdims=True) * np.sqrt(2)
        b /= np.linalg.norm(b, axis=-1, keepdims=True) * np.sqrt(2)
        log_w = -3.0 * rng.random((t, h, dk)) ** 2
    return q, k, v, a, b, log_w


def run(
    x: Any, s0: Any, bounds: list[int], c: int, cdt: Any, sdt: Any,
    kernel: Callable[..., Any] | None = None, convert: Callable[[np.ndarray], Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """`kernel` (default: the Numba kernel's `dplr_chunks`) over the calls [lo, hi) of `bounds`
    from state s0: (out [T, H, d_v], S).  The inputs go in as cdt, through `convert` when given
    (bfloat16 forms)."""
    if kernel is None:
        from linstream.ops.dplr.numba import dplr_chunks as kernel
    conv = convert if convert is not None else (lambda y: y)
    s = np.array(s0, dtype=sdt)
    outs = []
    for lo, hi in itertools.pairwise(bounds):
        o = np.asarray(kernel(*(conv(np.asarray(y[lo:hi], cdt)) for y in x), s, chunk_size=c))
        assert o.dtype == cdt and s.dtype == sdt
        outs.append(o)
    return np.concatenate(outs), s


def tolerance(x: Any, out_ref: Any, s_ref: Any, t: int, c: int, cdt: Any, sdt: Any) -> float:
    """The derived bound (see the module docstring) on |out − ref| and |S − S_ref|."""
    q, k, v, a, b, _ = (float(np.max(np.abs(y))) for y in x)
    sm, om = float(np.max(np.abs(s_ref))), float(np.max(np.abs(out_ref)))
    m = max(q, 1.0) * max(sm, k * v, b * a * sm, om)
    dk = x[0].shape[2]
    n = 2 * dk * (c + 1) + c + -(-t // c)
    u = float(np.finfo(cdt).eps) / 2 + float(np.finfo(sdt).eps) / 2
    return 4 * n * u * m
