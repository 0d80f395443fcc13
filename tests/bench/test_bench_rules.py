"""Kernel throughput of every update rule beside `additive` (H=8, d=64).

    pytest tests/bench/test_bench_rules.py -m bench -s

H=8, d_k=d_v=64, T=65536, float32 inputs, elu+1, float64 carried state (the default), Numba
kernels, contenders interleaved in rounds (best of 3 each; tests/helpers/bench_timing.py).  The
parameters (γ, log α, β) are made once outside the timed call.  The run's table is printed and
written to build/bench/rules.md; docs/benchmarks.md carries the tables of record.
"""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
from helpers.bench_report import report
from helpers.bench_timing import best_times, matmul_flops
from linstream.ops import causal_linear_attention

H, D_K, D_V, T = 8, 64, 64, 65536
COMMAND = "pytest tests/bench/test_bench_rules.py -m bench -s"


def _inputs():
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((T, H, D_K), dtype=np.float32) for _ in range(2))
    v = rng.standard_normal((T, H, D_V), dtype=np.float32)
    params = {
        "gamma": np.linspace(0.9, 0.999, H),
        "log_alpha": -rng.uniform(0.001, 0.1, size=(T, H)).astype(np.float32),
        "beta": rng.uniform(0.1, 1.0, size=(T, H)).astype(np.float32),
    }
    return q, k, v, params


RULES = {
    "additive": {},
    "decay": {"gamma": None},
    "gated": {"log_alpha": None},
    "gated, normalize=False": {"log_alpha": None, "normalize": False},
    "delta": {"beta": None},
    "gated_delta": {"log_alpha": None, "beta": None},
}


@pytest.mark.bench
def test_bench_rules_throughput():
    q, k, v, params = _inputs()
    roof_before = matmul_flops()
    contenders = {}
    for name, spec in RULES.items():
        kw = {n: (params[n] if x is None else x) for n, x in spec.items()}
        rule = name.split(",")[0]
        chunks = (None,) if rule == "additive" else (32, 64)
        for c in chunks:
            label = name if c is None else f"{name} C={c}"
            contenders[label] = lambda rule=rule, kw=kw, c=c: causal_linear_attention(
                q, k, v, rule=rule, backend="numba", chunk_size=c, **kw
            )
    best = best_times(contenders, rounds=3)
    roof = max(roof_before, matmul_flops())
    base = T / best["additive"]
    lines = [
        f"H={H}, d_k=d_v={D_K}, T={T}, float32 inputs, elu+1, float64 state; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, float32 matmul roof "
        f"{roof / 1e9:.0f} GFLOP/s",
        "",
        "| rule | tokens/s | vs additive |",
        "|---|---:|---:|",
    ]
    for label, sec in best.items():
        lines.append(f"| {label} | {T / sec:,.0f} | {T / sec / base:.2f}× |")
    report(
        "rules",
        "\n".join(lines),
        header=f"# Update-rule kernels: throughput beside additive\n\nCommand: `{COMMAND}`",
    )
    assert all(np.isfinite(list(best.values())))
