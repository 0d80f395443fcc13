"""A sequence's history through whole jobs: shuffled order at scale (Beam state across the
runner's bundles), and a fallback that rolls back a commit whose outputs were written (the
`linstream` command).  Final chunks, resent chunks and oversized chunks are checked on the stage
itself, without a runner (stage/test_ordering.py)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.crash import judge, result_rows
from helpers.pipelines import run_transform
from helpers.store_faults import flip_bit
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

SEED = 20261201


def _qkv(rng, t, h=2, dk=3, dv=2):
    q, k = rng.standard_normal((2, t, h, dk))
    return {"q": q, "k": k, "v": rng.standard_normal((t, h, dv))}


def _sequence(seed, n_chunks, seq="s", t=3):
    rng = np.random.default_rng(seed)
    return [Chunk(seq, i, _qkv(rng, t), final=i == n_chunks - 1) for i in range(n_chunks)]


def _attn(**kw):
    return CausalLinearAttention(backend="numpy", **kw)


def test_a_globally_shuffled_long_sequence_is_applied_completely(tmp_path):
    n = 3000
    rng = np.random.default_rng(SEED + 2)
    chunks = _sequence(SEED + 2, n, t=1)
    shuffled = [chunks[int(i)] for i in rng.permutation(n)]
    t0 = time.perf_counter()
    run = run_transform(shuffled, _attn(), tmp_path)
    print(f"{n} shuffled chunks in {time.perf_counter() - t0:.1f} s")
    assert run.dead == []
    assert [r.index for r in run.results] == list(range(n))
    one = run_transform(chunks, _attn(), tmp_path)
    assert all(
        np.array_equal(a.output, b.output) for a, b in zip(run.results, one.results, strict=True)
    )


@pytest.mark.parametrize("fallback", [True])
def test_falling_back_past_a_corrupt_commit_rewrites_its_outputs_once(
    tmp_path, tiny_model_path, fallback
):
    import subprocess

    from helpers.crash import embed_cmd
    from linstream.pipeline.app.sample import sample_chunks
    from linstream.pipeline.io import write_chunk_file

    chunks = sample_chunks(2, 12 * 16, 16, seed=3, shuffle=True, vocab_size=256)
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, chunks)
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    ref = str(tmp_path / "ref")
    extra = ("--checkpoint-every", "5")
    subprocess.run(
        embed_cmd(tiny_model_path, inp, ref, str(tmp_path / "ck-ref"), *extra), check=True
    )
    subprocess.run(embed_cmd(tiny_model_path, inp, out1, ckpt, *extra), check=True)
    store = CheckpointStore(ckpt)
    newest = store.commits("seq-0000")[0]
    flip_bit(newest.data_path, 200)
    done = subprocess.run(
        embed_cmd(tiny_model_path, inp, out2, ckpt, "--resume", "--restore-fallback", *extra),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = judge(ref, [out1, out2])
    assert verdict.ok, str(verdict)
    # The rolled-back span was recomputed into the new job's folder, and its old file removed.
    assert {k[0] for k, _, _ in result_rows(out2)} == {"seq-0000"}
    assert os.path.isdir(os.path.join(out2, "results"))
