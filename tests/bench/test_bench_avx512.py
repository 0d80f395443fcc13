"""Benchmark: linstream's AVX-512 product kernels (`linstream.ops.model.fla.avx512`) against the
libraries the runtime could call instead, one thread each, on the ~110M models' product shapes,
at the rows a 2,048-token chunk gives each of the runtime's two row ranges (1,024) and at a
64-token chunk's.

    .venv/bin/python -m pytest tests/bench/test_bench_avx512.py -m bench -s -p no:randomly

Per shape [m × k] @ [k × n], GFLOP/s (2·m·k·n over the best of ROUNDS interleaved timings of
REPS calls each): the bfloat16 kernel (its weight packed once), the float32 kernel (packed once),
NumPy's float32 BLAS (OpenBLAS; it copies the weight into its own layout at every call), MKL's
bfloat16 product on the weight packed once (Intel's mkl package) and MKL's SGEMM, where found, and
PyTorch's bfloat16 matmul (oneDNN; bfloat16 output) where installed, each at one thread.  Each
kernel's output is checked against the exact product within Higham's bound (as
tests/ops/fla/test_avx512_products.py); nothing is asserted about speed.  Skipped on a CPU without
the instructions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from linstream.ops.model.fla import avx512
from threadpoolctl import threadpool_limits

pytestmark = pytest.mark.bench

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(1024, 768, 2304), (1024, 768, 4096), (1024, 2048, 768), (64, 768, 2304), (64, 2048, 768)]
ROUNDS, REPS = 5, 5


def _rate(fn: Callable[[], None], flops: float) -> float:
    t = time.perf_counter()
    for _ in range(REPS):
        fn()
    return flops / ((time.perf_counter() - t) / REPS) / 1e9


def _within_bound(out: np.ndarray, x: np.ndarray, w: np.ndarray) -> bool:
    k = x.shape[1]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    return bool(np.all(np.abs(out - x64 @ w64.T) <= gamma * (np.abs(x64) @ np.abs(w64).T)))


def _rivals(x32: np.ndarray, w32: np.ndarray, out: np.ndarray) -> dict[str, Callable[[], None]]:
    """The libraries' products of the same operands, where they are found."""
    calls: dict[str, Callable[[], None]] = {"NumPy f32": lambda: np.matmul(x32, w32.T, out=out)}
    from linstream.ops.model.fla import mkl

    with contextlib.suppress(mkl.MKLUnavailable):
        mkl.library()
        xb, n = x32.astype(BF16), w32.shape[0]
        if mkl.can_pack():
            packed = mkl.Packed(w32.astype(BF16), [slice(0, n)])
            calls["MKL bf16 packed"] = lambda: packed.rows(xb, 0, out)
        calls["MKL f32"] = lambda: mkl.sgemm_rows(x32, w32, out)
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(1)
        xt, wt = torch.from_numpy(x32).bfloat16(), torch.from_numpy(w32).bfloat16()
        calls["torch bf16"] = lambda: torch.nn.functional.linear(xt, wt)
    return calls


def test_bench_avx512_products():
    for dtype in ("bfloat16", "float32"):
        why = avx512.reason_unavailable(dtype)
        if why is not None:
            pytest.skip(f"the {dtype} kernel: {why}")
    rng = np.random.default_rng(0)
    lines = ["| m × k × n | " + " | ".join(("kernel bf16", "kernel f32", "rivals")) + " |"]
    lines.append("|---|---:|---:|---|")
    for m, k, n in SHAPES:
        x32 = rng.standard_normal((m, k), dtype=np.float32)
        w32 = rng.standard_normal((n, k), dtype=np.float32)
        out = np.empty((m, n), np.float32)
        xb, wb = x32.astype(BF16), w32.astype(BF16)
        kb = avx512.Packed(wb, [slice(0, n)])
        kf = avx512.Packed(w32, [slice(0, n)])
        calls = {
            "kernel bf16": lambda kb=kb, xb=xb, out=out: kb.rows(xb, 0, out),
            "kernel f32": lambda kf=kf, x32=x32, out=out: kf.rows(x32, 0, out),
            **_rivals(x32, w32, out),
        }
        kb.rows(xb, 0, out)
        assert _within_bound(out, xb, wb), (m, k, n)
        kf.rows(x32, 0, out)
        assert _within_bound(out, x32, w32), (m, k, n)
        best = dict.fromkeys(calls, 0.0)
        with threadpool_limits(1, user_api="blas"):
            for fn in calls.values():
                fn()  # warm: compiled, packed, the libraries loaded
            for _ in range(ROUNDS):
                for name, fn in calls.items():
                    best[name] = max(best[name], _rate(fn, 2.0 * m * k * n))
        rivals = ", ".join(f"{name} {best[name]:.0f}" for name in calls if "kernel" not in name)
        lines.append(
            f"| {m} × {k} × {n} | {best['kernel bf16']:.0f} | {best['kernel f32']:.0f} | {rivals} |"
        )
    print("\nGFLOP/s, one thread each (best of interleaved rounds):\n" + "\n".join(lines))
