"""`--keep-every-tokens` is recorded in the checkpoint store: a second job (`--resume`) and
`linstream checkpoint gc` not given the flag keep the same history; `0` given explicitly turns it
off.  Each step is its own `linstream` process; the kept positions are read with `linstream
checkpoint inspect --json`, as a user does."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.cli import linstream
from linstream.pipeline import Chunk
from linstream.pipeline.io import write_chunk_file

pytestmark = pytest.mark.e2e  # two jobs and three store commands, each its own process

CHUNK = 8
RUNNER = "--runner=FnApiRunner"


def _positions(root) -> list[int]:
    proc = linstream("checkpoint", "inspect", root, "--json")
    assert proc.returncode == 0, proc.stderr
    (rec,) = [json.loads(line) for line in proc.stdout.splitlines()]
    return rec["positions"]


def _embed(model, inp, out, ckpt, *extra):
    proc = linstream(
        "embed", "--model", model, "--backend", "numpy", "--input", inp, "--output", out,
        "--emit", "mean", "--progress-every", "0", "--checkpoint-dir", ckpt,
        "--checkpoint-every", "1", *extra, RUNNER,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc


def test_second_job_and_gc_keep_the_recorded_history(tmp_path, tiny_model_path):
    seed = 5
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)  # token values only; the positions are what is checked
    parts = [rng.integers(0, 256, CHUNK).astype(np.int32) for _ in range(10)]
    first, whole = tmp_path / "first.parquet", tmp_path / "whole.parquet"
    write_chunk_file(str(first), [Chunk("a", i, p, final=False) for i, p in enumerate(parts[:6])])
    write_chunk_file(str(whole), [Chunk("a", i, p, final=i == 9) for i, p in enumerate(parts)])
    ckpt = tmp_path / "ckpt"

    one = _embed(tiny_model_path, first, tmp_path / "o1", ckpt, "--keep-every-tokens", "16")
    assert "recorded in" in one.stderr
    assert _positions(ckpt) == [16, 32, 40, 48]

    # Job 2 continues without the flag: 16..80 kept by the recorded 16, not only 72 and 80.
    two = _embed(tiny_model_path, whole, tmp_path / "o2", ckpt, "--resume")
    said = [ln for ln in two.stderr.splitlines() if "as recorded in" in ln]
    assert len(said) == 1, two.stderr  # said once
    assert "16 tokens" in said[0]
    assert _positions(ckpt) == [16, 32, 48, 64, 72, 80]

    gc = linstream("checkpoint", "gc", ckpt)
    assert gc.returncode == 0, gc.stderr
    assert "as recorded in" in gc.stderr
    assert _positions(ckpt) == [16, 32, 48, 64, 72, 80]

    off = linstream("checkpoint", "gc", ckpt, "--keep-every-tokens", "0")
    assert off.returncode == 0, off.stderr
    assert "no longer keeping" in off.stderr
    assert _positions(ckpt) == [72, 80]
    again = linstream("checkpoint", "gc", ckpt)  # off stays off
    assert again.returncode == 0 and "recorded" not in again.stderr, again.stderr
