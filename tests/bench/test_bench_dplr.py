"""Throughput of the generalized delta rule's chunkwise kernel (DPLR form, RWKV-7's time mix)
at RWKV-7 191M's shape, by chunk length.

    pytest tests/bench/test_bench_dplr.py -m bench -s

T=2048 (one benchmark prompt), H=12, d_k=d_v=64, float32 inputs in RWKV-7's form (a = −k̂,
b = k̂·α, decays in (−0.607, 0)), float64 carried state, BLAS held at one thread as in the model's
forward (the kernel's heads run on Numba's threads); contenders interleaved in rounds (best of
3; tests/helpers/bench_timing.py).  Also printed: the kernel's multiply-adds per second (its
in-chunk products counted as dense) beside NumPy's float32 matmul rate.  The run's table is
printed and written to build/bench/dplr.md.
"""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
from helpers.bench_report import report
from helpers.bench_timing import best_times, matmul_flops
from linstream.ops.dplr.numba import DEFAULT_DPLR_CHUNK, dplr_chunks
from linstream.ops.model.blas import _thread_layout

T, H, D = 2048, 12, 64
CHUNKS = (16, 32, 64)
COMMAND = "pytest tests/bench/test_bench_dplr.py -m bench -s"


def _inputs():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((T, H, D), dtype=np.float32) for _ in range(3))
    kk = rng.standard_normal((T, H, D))
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    a = (-kk).astype(np.float32)
    b = (kk * rng.random((T, H, D))).astype(np.float32)
    w = (-0.6065306597126334 * rng.random((T, H, D))).astype(np.float32)
    return q, k, v, a, b, w


def _flops(c: int) -> float:
    """Per chunk and head: the four score blocks (2c·d·2c), the UT right side (c·c·d + c·d·d),
    the substitution (c²/2·d), the outputs (c·(2c + d)·d) and the state update (d·2c·d)."""
    per = 4 * c * c * D + c * c * D + c * D * D + c * c * D / 2 + c * (2 * c + D) * D
    per += 2 * c * D * D
    return 2.0 * per * H * (T / c)


@pytest.mark.bench
def test_bench_dplr_chunk_lengths():
    x = _inputs()
    roof = matmul_flops()
    blas, _ = _thread_layout()
    contenders = {c: lambda c=c: dplr_chunks(*x, np.zeros((H, D, D)), chunk_size=c) for c in CHUNKS}
    with blas:
        best = best_times(contenders, rounds=3)
    lines = [
        f"T={T}, H={H}, d_k=d_v={D}, float32 inputs (RWKV-7's form), float64 state, BLAS at one "
        f"thread; {platform.machine()}, {os.cpu_count()} CPUs, float32 matmul roof "
        f"{roof / 1e9:.0f} GFLOP/s; default chunk {DEFAULT_DPLR_CHUNK}",
        "",
        "| chunk | tokens/s | ms per layer | GFLOP/s (products as dense) |",
        "|---:|---:|---:|---:|",
    ]
    for c, sec in best.items():
        lines.append(f"| {c} | {T / sec:,.0f} | {sec * 1e3:.1f} | {_flops(c) / sec / 1e9:.1f} |")
    report(
        "dplr",
        "\n".join(lines),
        header=f"# DPLR kernel (RWKV-7's time mix) by chunk length\n\nCommand: `{COMMAND}`",
    )
    assert all(np.isfinite(list(best.values())))
