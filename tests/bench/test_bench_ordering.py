"""Ordering at scale (`make bench`): one sequence of N chunks, globally shuffled, through the
stateful stage (raw q/k/v, H=1, d=4, 4 tokens a chunk, FnApiRunner), against the same chunks in
order in the same run.  The shuffled time should grow about linearly in N: the stage keeps an
index of buffered chunk numbers beside the bag and reads the bag only to drain a run, in passes
bounded by DRAIN_BYTES, never once per arriving chunk.

    .venv/bin/python -m pytest tests/bench/test_bench_ordering.py -m bench -s
"""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
from helpers.pipelines import run_transform
from linstream.pipeline import CausalLinearAttention, Chunk

pytestmark = pytest.mark.bench


def _chunks(n, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, 4, 1, 4)) for _ in range(3))
    return [Chunk("s", i, {"q": q[i], "k": k[i], "v": v[i]}, final=i == n - 1) for i in range(n)]


def test_shuffled_order_scales_about_linearly(tmp_path):
    rows = []
    for n in (1000, 10000):
        chunks = _chunks(n)
        order = np.random.default_rng(n).permutation(n)
        shuffled = [chunks[int(i)] for i in order]
        times = {}
        for name, data in (("in order", chunks), ("shuffled", shuffled)):
            t0 = time.perf_counter()
            run = run_transform(data, CausalLinearAttention(backend="numpy"), tmp_path)
            times[name] = time.perf_counter() - t0
            assert run.dead == [] and len(run.results) == n
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append((n, times["in order"], times["shuffled"], rss))
    print("\n| chunks | in order s | shuffled s | shuffled / in order | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|")
    for n, a, b, rss in rows:
        print(f"| {n:,} | {a:.1f} | {b:.1f} | {b / a:.2f} | {rss:.0f} |")
    growth = rows[1][2] / rows[0][2]
    print(f"shuffled time 10,000 / 1,000 chunks: {growth:.1f}x (linear: 10x)")
    assert growth < 20, growth
