"""Benchmark helpers: best-of-N wall time with the contenders interleaved, and the matmul roof.

The machine has 2 shared cores whose second one is sometimes busy: contenders are measured in
rounds (each round times every contender once) and compared within one run, never across runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def best_times(contenders: dict[str, Callable[[], object]], rounds: int = 3) -> dict[str, float]:
    """Warm every contender once, then `rounds` interleaved rounds; best wall time each."""
    for fn in contenders.values():
        fn()
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def matmul_flops(n: int = 2048, reps: int = 5) -> float:
    """float32 n³ matmul rate of NumPy's BLAS with its default threads (FLOP/s, best of reps)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best
