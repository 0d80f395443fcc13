"""The model runtime with PyTorch imported before linstream, against linstream first
(`linstream.ops.omp_wait`: Numba's parallel kernels on a libgomp of their own, waiting
passively, whatever came first), and with Numba's OpenMP layer left on PyTorch's libgomp (what
the runtime ran before: a parallel kernel run before linstream is imported loads it there).

Each family's bench-size model (`helpers.rwkv_mamba_models`: RWKV-7 and Mamba-2 from their own
classes, float32) runs 2,048-token chunks in fresh processes, the three orders in turn (their
order rotated each repeat); the table gives each order's tokens/s and its ratio to linstream
first.  Only the process left on PyTorch's libgomp says so, in one line.

    .venv/bin/python -m pytest tests/bench/test_bench_import_order.py -m bench -s -p no:randomly
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHUNK = 2048
ROUNDS = 3  # timed chunks a process (the best one counts), after one warm-up chunk
REPEATS = 3  # each order this many times per family, the orders rotated
FAMILIES = ("rwkv7", "mamba2")

_CHILD = """
import json, sys, time
import numpy as np
order, folder = sys.argv[1], sys.argv[2]
if order in ("torch", "torch-numba"):
    import torch
if order == "torch-numba":  # Numba's OpenMP layer loaded on PyTorch's libgomp, before linstream
    import numba
    @numba.njit(parallel=True)
    def twice(x):
        for i in numba.prange(x.shape[0]):
            x[i] *= 2
    twice(np.ones(64))
from linstream.ops.model.fla import load_model
model = load_model(folder)
ids = np.random.default_rng(0).integers(0, model.config.common.vocab_size, CHUNK)
_, state = model.embed_chunk(ids, None)
best = float("inf")
for _ in range(ROUNDS):
    t0 = time.perf_counter()
    _, state = model.embed_chunk(ids, state)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"tokens_per_s": CHUNK / best}))
""".replace("CHUNK", str(CHUNK)).replace("ROUNDS", str(ROUNDS))


def _child(order: str, folder: str) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, order, folder],
        capture_output=True, text=True, env=env, timeout=1800, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_s"], r.stderr


@pytest.mark.bench
def test_bench_import_order(tmp_path):
    pytest.importorskip("torch")
    from helpers.rwkv_mamba_models import cached_model_folder

    root = os.environ.get("LINSTREAM_BENCH_MODELS", str(tmp_path))
    orders = ("linstream", "torch", "torch-numba")
    lines = [
        f"{CHUNK}-token float32 chunks, 2 threads, best of {ROUNDS} per process, "
        f"{REPEATS} processes per order (rotated); load average {os.getloadavg()[0]:.1f}",
        "",
        "| model | linstream first tok/s | torch first tok/s (ratio) | torch and a Numba parallel "
        "kernel first: Numba on PyTorch's libgomp, tok/s (ratio) |",
        "|---|---:|---:|---:|",
    ]
    for family in FAMILIES:
        folder = str(cached_model_folder(root, family, "bench"))
        rates: dict[str, list[float]] = {o: [] for o in orders}
        for rep in range(REPEATS):
            for order in orders[rep % 3 :] + orders[: rep % 3]:
                rate, stderr = _child(order, folder)
                rates[order].append(rate)
                said = [line for line in stderr.splitlines() if "OMP_WAIT_POLICY" in line]
                assert len(said) == (1 if order == "torch-numba" else 0), stderr
        mean = {o: sum(v) / len(v) for o, v in rates.items()}
        first = mean["linstream"]
        lines.append(
            f"| {family} | {first:.0f} | {mean['torch']:.0f} ({mean['torch'] / first:.2f}) "
            f"| {mean['torch-numba']:.0f} ({mean['torch-numba'] / first:.2f}) |"
        )
    print("\n" + "\n".join(lines))
