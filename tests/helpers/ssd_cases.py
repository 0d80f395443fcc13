"""Cases for Mamba-2's SSD kernels, run the same way on each implementation (the Numba kernel,
the CUDA kernel on a device or on the CPU emulator): random inputs in Mamba-2's working ranges,
transformers' own scan as the reference, a run over a split into calls with the state carried,
and the derived tolerance (tests/ops/ssd/test_ssd_kernel.py, test_ssd_cupy_emu.py,
tests/gpu/gpu_check_rules.py).

Tolerance, derived from the dtype: the reference is transformers' scan in float64 (a float64 clone
of its own source, so its math in float64 throughout); its float32 run differs from that by e32
(measured per case: its rounding at float32's unit roundoff u32 on these inputs).  A kernel in a
compute dtype of unit roundoff u must stay within FACTOR · e32 · u / u32: the same rounding at
that dtype's roundoff, with a factor of 8 (3 bits) for another summation order (chunks of another
length, the state carried between calls, a polynomial exp in float32).  A float32 state (rounded
at every call) counts as a float32 compute dtype.

e32 is one sample of a rounding error, and the kernel's error (and the float64 reference's own) is
another: on a short random case their ratio passes 8 now and then (seen: 12.7 in 200 seeds).  So
`tolerances` also allows the first-order a-priori bound of recursive summation, which no draw can
pass: an output sums at most T + 3 rounded terms per token (T tokens, each a product of three
rounded factors), so each of the two runs is within (T + 3) · u · Σ|terms| of the exact value,
and the two within FACTOR · (T + 3) · u · Σ|terms|, Σ|terms| the same scan over |x|, |B|, |C|,
|D| (every decay and time step is positive) — the largest of it over the outputs.  The fixed
cases (`bounds_of`: the device check's prepared references) keep the sampled bound alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FACTOR", "U32", "bounds_of", "case", "reference", "scan_errors", "streamed",
           "summation_bounds", "tolerances", "unit", "worst"]  # fmt: skip

FACTOR = 8
U32 = float(np.finfo(np.float32).eps) / 2


def unit(dtype: Any) -> float:
    return float(np.finfo(dtype).eps) / 2


def case(rng: np.random.Generator, t: int, g: int, hpg: int, p: int, n: int) -> dict:
    """Inputs in Mamba-2's working ranges: x, B, C ~ N(0, 1) (after the conv's SiLU they are
    O(1)), raw dt ~ N(−1, 1) with dt_bias ~ N(−2, 1) (time steps ~ 0.01–1), A = −e^{U(−2, 3)}
    (decays per token from ~e^-0.001 to ~e^-20), D ~ 1 + N(0, 0.1)."""
    h = g * hpg
    return dict(
        x=rng.standard_normal((t, h, p)),
        dt=rng.standard_normal((t, h)) - 1.0,
        a=-np.exp(rng.uniform(-2, 3, h)),
        b=rng.standard_normal((t, g, n)),
        c=rng.standard_normal((t, g, n)),
        d=1.0 + 0.1 * rng.standard_normal(h),
        dt_bias=rng.standard_normal(h) - 2.0,
    )


def reference(kw: dict, limit: Any, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """transformers' scan (tests/helpers/mamba2_oracle.py) in a torch dtype: (y, final state)."""
    from helpers.mamba2_oracle import chunk_scan

    return chunk_scan(
        kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"], d=kw["d"], dt_bias=kw["dt_bias"],
        dt_limit=limit, chunk_size=32, dtype=dtype,
    )  # fmt: skip


def streamed(
    kw: dict, limit: Any, bounds: list[int], cdt: Any, sdt: Any, chunk: int,
    kernel: Callable[..., Any] | None = None, convert: Callable[[np.ndarray], Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """`kernel` (default: the Numba kernel's `ssd_chunks`) called once per piece of `bounds`, the
    state carried in place: (y [T, H, P] as returned, concatenated; the state in sdt).  x, B, C
    go in as cdt, through `convert` when given (bfloat16 forms)."""
    if kernel is None:
        from linstream.ops.ssd.numba import ssd_chunks as kernel
    h, p = kw["x"].shape[1:]
    state = np.zeros((h, p, kw["b"].shape[2]), sdt)
    conv = convert if convert is not None else (lambda v: v)
    ys = []
    for a, b in itertools.pairwise(bounds):
        ys.append(
            np.asarray(
                kernel(
                    conv(kw["x"][a:b].astype(cdt)),
                    kw["dt"][a:b],
                    kw["a"],
                    conv(kw["b"][a:b].astype(cdt)),
                    conv(kw["c"][a:b].astype(cdt)),
                    kw["d"],
                    state,
                    dt_bias=kw["dt_bias"],
                    dt_limit=limit,
                    chunk_size=chunk,
                )
            )
        )
    return np.concatenate(ys), state


def worst(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b), initial=0.0))


def scan_errors(kw: dict, limit: Any) -> dict[str, Any]:
    """transformers' scan on the case: its float64 run (y64, s64) and its float32 run's worst
    errors against that (e32 on y, e32s on the state)."""
    import torch

    y64, s64 = reference(kw, limit, torch.float64)
    y32, s32 = reference(kw, limit, torch.float32)
    return {"y64": y64, "s64": s64, "e32": max(worst(y32, y64), 1e-300),
            "e32s": max(worst(s32, s64), 1e-300)}  # fmt: skip


def bounds_of(scan: dict[str, Any], cdt: Any, sdt: Any) -> tuple[float, float]:
    """The derived bounds (on y, on the state) for a kernel run in compute dtype cdt with a
    state in sdt, from `scan_errors` (see the module docstring)."""
    u = max(unit(cdt), unit(sdt))
    return FACTOR * scan["e32"] * u / U32, FACTOR * scan["e32s"] * u / U32


def summation_bounds(kw: dict, limit: Any, cdt: Any, sdt: Any) -> tuple[float, float]:
    """The a-priori bounds (on y, on the state): FACTOR · (T + 3) · u · the largest Σ|terms| of
    an output (see the module docstring)."""
    import torch

    absolute = dict(kw, **{k: np.abs(kw[k]) for k in ("x", "b", "c", "d")})
    ya, sa = reference(absolute, limit, torch.float64)
    scale = FACTOR * (kw["x"].shape[0] + 3) * max(unit(cdt), unit(sdt))
    return scale * float(np.max(ya, initial=0.0)), scale * float(np.max(sa, initial=0.0))


def tolerances(kw: dict, limit: Any, cdt: Any, sdt: Any) -> dict[str, Any]:
    """The float64 reference (y64, s64) and the derived bounds (tol, tol_s) for a kernel run in
    compute dtype cdt with a state in sdt: the sampled bound or the a-priori one, whichever is
    larger (see the module docstring)."""
    scan = scan_errors(kw, limit)
    tol, tol_s = bounds_of(scan, cdt, sdt)
    sum_y, sum_s = summation_bounds(kw, limit, cdt, sdt)
    return {"y64": scan["y64"], "s64": scan["s64"], "tol": max(tol, sum_y),
            "tol_s": max(tol_s, sum_s)}  # fmt: skip
