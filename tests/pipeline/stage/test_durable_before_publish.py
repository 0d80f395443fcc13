"""The stage fsyncs a commit's folder in batches (at a bundle's end, or once enough commits
wait), never after publishing the outputs the commit names: a result file appears only once
every commit made before it is durable.  Judged from the process's own link and fsync calls.
Driven without a runner (tests/helpers/stage_runs.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.stage_runs import run_stage
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.io import read_results

SEED = 20261202


@pytest.fixture
def calls(monkeypatch):
    """("link", destination) and ("fsync", path) in the order the process makes them."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to name a descriptor's path")
    seen: list[tuple[str, str]] = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd):
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def link(src, dst, *args, **kwargs):
        real_link(src, dst, *args, **kwargs)
        seen.append(("link", str(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    return seen


@pytest.mark.parametrize("every", [1, 2])
def test_results_appear_only_after_their_commits_are_durable(every, tmp_path, calls):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    n, size = 5, 3
    chunks = []
    for s in range(3):
        q, k, v = (rng.standard_normal((n * size, 2, 3)) for _ in range(3))
        for i in range(n):
            part = {x: a[i * size : (i + 1) * size] for x, a in zip("qkv", (q, k, v), strict=True)}
            chunks.append(Chunk(f"s{s}", i, part, final=i == n - 1))
    order = rng.permutation(len(chunks))
    out = str(tmp_path / "out")
    run = run_stage(
        [chunks[int(i)] for i in order],
        CausalLinearAttention(
            backend="numpy",
            checkpoint_every=every,
            checkpoint_dir=str(tmp_path / "ckpt"),
            output_dir=out,
        ),
    )
    assert run.dead == []
    assert len(read_results(out)) == 3 * n

    waiting: set[str] = set()  # folders holding a commit whose name is not durable yet
    published = commits = 0
    for what, path in calls:
        folder, _, name = path.rpartition("/")
        if what == "link" and name.endswith(".commit.json"):
            waiting.add(folder)
            commits += 1
        elif what == "fsync":
            waiting.discard(path)
        elif what == "link" and name.startswith("part-"):
            assert not waiting, f"{name} published before the commits in {sorted(waiting)}"
            published += 1
    assert commits >= 3 * n // every and published >= 1
    assert not waiting  # the job's end left no commit undurable
