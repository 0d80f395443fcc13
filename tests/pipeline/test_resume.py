"""Checkpoint and resume: part job + resume job = one job; SIGKILL mid-run loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _beam_helpers import run_transform
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.demo import compare_results
from linstream.pipeline.io import read_dead_letters, read_results, write_chunk_file
from linstream.pipeline.sample import sample_chunks
from linstream.state import CheckpointStore

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.cli"]


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


def _embed_cmd(model, inp, out, ckpt, *extra):
    return [
        *LINSTREAM,
        "embed",
        "--model",
        model,
        "--backend",
        "numpy",
        "--input",
        inp,
        "--output",
        out,
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        "1",
        "--max-buffered-chunks",
        "1000",
        "--progress-every",
        "0",
        *extra,
    ]


def test_sigkill_mid_run_then_resume_loses_nothing_and_repeats_nothing(tmp_path, tiny_model_path):
    n_chunks, size = 300, 32
    chunks = sample_chunks(
        3, n_chunks * size, size, seed=5, shuffle=True, duplicates=4, vocab_size=256
    )
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, chunks)
    ckpt, ckpt_full = str(tmp_path / "ckpt"), str(tmp_path / "ckpt-full")
    full_out, killed_out, resumed_out = (str(tmp_path / n) for n in ("full", "killed", "resumed"))
    subprocess.run(
        _embed_cmd(tiny_model_path, inp, full_out, ckpt_full), check=True, capture_output=True
    )
    full = read_results(full_out)
    seqs = sorted({c.seq_id for c in chunks})

    proc = subprocess.Popen(
        _embed_cmd(tiny_model_path, inp, killed_out, ckpt),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = CheckpointStore(ckpt)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            done = sum(len(store.commits(s)) > 0 for s in store.sequences())
            if done >= 1:
                break
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    fp = _fingerprint(tiny_model_path)
    at_kill = {s: store.restore(s, fingerprint=fp, fallback=True) for s in seqs}
    next_at_kill = {s: (st.next_chunk if st else 0) for s, st in at_kill.items()}
    assert sum(next_at_kill.values()) > 0, "killed before any commit"
    assert sum(next_at_kill.values()) < 3 * n_chunks, "the job finished before the kill"

    out = subprocess.run(
        _embed_cmd(tiny_model_path, inp, resumed_out, ckpt, "--resume"),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    resumed = read_results(resumed_out)
    assert read_dead_letters(resumed_out) == [] and read_dead_letters(full_out) == []
    # Applies none twice: the resumed job emits exactly the chunks after each restore point...
    expected = {(s, i) for s in seqs for i in range(next_at_kill[s], n_chunks)}
    assert set(resumed) == expected
    # ... loses none: with identical outputs, and the same final states as one run.
    problems, worst = compare_results({k: full[k] for k in expected}, resumed)
    assert problems == [] and worst <= 1e-6, (problems, worst)
    full_store = CheckpointStore(ckpt_full)
    for s in seqs:
        a, b = full_store.restore(s, fingerprint=fp), store.restore(s, fingerprint=fp)
        assert (
            (a.position, a.next_chunk) == (b.position, b.next_chunk) == (n_chunks * size, n_chunks)
        )
        np.testing.assert_allclose(b.S, a.S, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(b.z, a.z, rtol=1e-9, atol=1e-9)
    assert "restores" in out


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
