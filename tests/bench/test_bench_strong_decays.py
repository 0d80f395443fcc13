"""Benchmark: the decaying kernels with strong decays against weak ones, the same shapes.

    .venv/bin/python -m pytest tests/bench/test_bench_strong_decays.py -m bench -s -p no:randomly

A head whose decays are strong (a trained model's fast-forgetting heads) makes decay factors far
below float32's normal range; computed, they are subnormal numbers, which an Intel core handles
by a microcode assist per instruction.  The kernels take factors below the flush
(`linstream.ops.decay.constants.flush_log`) as zeros.  Per kernel (H=4, T=2,048, d=64, float32,
best of 3): the time with log decays of about −0.05, −1.2, −3 and −20 a token (each token's times
a seeded factor in [0.5, 1.5]), and the ratio of the strong ones' (−3, −20) time to the slower of
the two without subnormal factors (−0.05, −1.2; see STRONG below).  Asserted: the
vector-gated kernel, the delta kernel and Mamba-2's SSD stay within 2× of that time (they ran
24×, 4.6× and ~10× slower before their flushes on a 2-vCPU Xeon with AMX); the DPLR kernel's
ratios are printed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

SEED = 20261205
H, T, D = 4, 2048, 64
LOGS = (-0.05, -1.2, -3.0, -20.0)
STRONG = LOGS[2:]
# the reference of the strong decays: the slower of the weak (-0.05) and the moderate (-1.2)
# decays, neither of which makes a subnormal factor in a chunk (e^{-1.2 x 1.5 x 32} = e^-58 is
# a normal float32) and the moderate one taking the vector-gated kernel's path for strong gates
# (pairs one by one; weak gates' chunks are one product): strong / reference is what the flush
# is for, not the two paths' costs
BOUNDED = ("vector-gated", "delta", "ssd")  # within 2x of the weak decays' time


def _best(fn, n: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _kernels(rng: np.random.Generator) -> dict:
    from linstream.ops.decay.vector_numba import vector_gated_chunks
    from linstream.ops.delta.numba import delta_chunks
    from linstream.ops.dplr.numba import dplr_chunks
    from linstream.ops.ssd.numba import ssd_chunks

    f = np.float32
    q = (rng.standard_normal((H, T, D)) * 0.1).astype(f)
    k = rng.standard_normal((H, T, D))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(f)
    v = rng.standard_normal((H, T, D)).astype(f)
    jitter = rng.uniform(0.5, 1.5, (H, T, D))
    qt, kt, vt = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v))
    b_ssd = rng.standard_normal((T, 1, D)).astype(f)
    c_ssd = rng.standard_normal((T, 1, D)).astype(f)

    def vector(lg):
        g = (lg * jitter).astype(f)
        return lambda: vector_gated_chunks(q, k, v, g, np.zeros((H, D, D), f))

    def delta(lg):
        g, beta = lg * jitter[..., 0], np.full((H, T), 0.5)
        return lambda: delta_chunks(q, k, v, np.zeros((H, D, D), f), g, beta, chunk_size=64)

    def dplr(lg):
        lw = (lg * jitter).transpose(1, 0, 2).astype(f)
        return lambda: dplr_chunks(qt, kt, vt, -kt, 0.5 * kt, lw, np.zeros((H, D, D), f))

    def ssd(lg):
        # A = -1 and steps whose softplus is |lg| (times the jitter): log decays of lg a token
        steps = np.log(np.expm1(np.abs(lg) * jitter[..., 0].T))
        return lambda: ssd_chunks(
            vt, steps, -np.ones(H), b_ssd, c_ssd, None, np.zeros((H, D, D), f), chunk_size=256
        )

    return {"vector-gated": vector, "delta": delta, "dplr": dplr, "ssd": ssd}


@pytest.mark.bench
def test_bench_strong_decays():
    print(f"seed={SEED}")
    rows, ratios = [], {}
    for name, make in _kernels(np.random.default_rng(SEED)).items():
        times = {lg: _best(make(lg)) for lg in LOGS}
        ref = max(times[LOGS[0]], times[LOGS[1]])
        ratios[name] = max(times[lg] / ref for lg in STRONG)
        cells = " | ".join(f"{times[lg] * 1e3:.1f}" for lg in LOGS)
        strong = " / ".join(f"{times[lg] / ref:.2f}" for lg in STRONG)
        rows.append(f"| {name} | {cells} | {strong} |")
    print(
        "\n| kernel | ms at log decay −0.05 | −1.2 | −3 | −20 | strong / reference (−3, −20) |\n"
        "|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows)
    )
    for name in BOUNDED:
        assert ratios[name] <= 2.0, (name, ratios[name])
