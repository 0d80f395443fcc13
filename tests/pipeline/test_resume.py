"""Checkpoint and resume: part job + resume job = one job (crashes: test_crash_recovery.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from helpers.pipelines import run_transform
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.app.demo import compare_results
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import read_results, write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.app.cli"]


def raw_chunks(seed, sequences=3, n_chunks=8):
    rng = np.random.default_rng(seed)
    out = []
    for s in range(sequences):
        for i in range(n_chunks):
            t = int(rng.integers(1, 6))
            q, k = rng.standard_normal((2, t, 2, 3))
            v = rng.standard_normal((t, 2, 2))
            out.append(Chunk(f"s{s}", i, {"q": q, "k": k, "v": v}, final=i == n_chunks - 1))
    return [out[int(i)] for i in rng.permutation(len(out))]


@pytest.mark.parametrize("seed", [0, 1])
def test_part_job_then_resume_job_equals_one_job(seed, tmp_path):
    chunks = raw_chunks(seed)
    rng = np.random.default_rng(seed + 100)
    stop = {f"s{s}": int(rng.integers(0, 9)) for s in range(3)}  # 0: nothing in part 1
    part1 = [c for c in chunks if c.index < stop[c.seq_id]]
    part2 = [c for c in chunks if c.index >= stop[c.seq_id]]
    ckpt = str(tmp_path / "ckpt")

    def make(**kw):
        return CausalLinearAttention(backend="numpy", checkpoint_every=3, **kw)

    one = run_transform(chunks, make(), tmp_path)
    r1 = run_transform(part1, make(checkpoint_dir=ckpt), tmp_path)
    r2 = run_transform(part2 + part1[:3], make(checkpoint_dir=ckpt, resume=True), tmp_path)
    assert r1.dead == [] and r2.dead == []
    assert r2.counters.get("duplicates", 0) == min(3, len(part1))  # already applied: dropped
    assert set(r1.by_key()).isdisjoint(r2.by_key())
    assert {**r1.by_key(), **r2.by_key()} == one.by_key()
    assert r2.counters.get("restores", 0) == sum(1 for v in stop.values() if v > 0)


def _fingerprint(model):
    from linstream.ops import load_model

    return load_model(model).fingerprint


def test_multi_processing_gives_the_same_outputs(tmp_path, tiny_model_path):
    chunks = sample_chunks(4, 6 * 128, 128, seed=9, shuffle=True, duplicates=3, vocab_size=256)
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, chunks)
    outs = {}
    for name, extra in (
        ("single", []),
        ("multi", ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
    ):
        out = str(tmp_path / name)
        subprocess.run(
            [
                *LINSTREAM,
                "embed",
                "--model",
                tiny_model_path,
                "--input",
                inp,
                "--output",
                out,
                "--progress-every",
                "0",
                *extra,
            ],
            check=True,
            capture_output=True,
        )
        outs[name] = read_results(out)
    assert len(outs["single"]) == 4 * 6
    problems, worst = compare_results(outs["single"], outs["multi"])
    assert problems == [] and worst == 0.0, (problems, worst)
