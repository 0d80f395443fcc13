"""A sequence's history is checked, not assumed: final chunks, resent chunks, shuffled order at
scale, oversized chunks, and a fallback that rolls back a commit whose outputs were written."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from _beam_helpers import run_transform
from _crash import judge, result_rows
from helpers.store_faults import flip_bit
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.state import CheckpointStore

SEED = 20261201


def _qkv(rng, t, h=2, dk=3, dv=2):
    q, k = rng.standard_normal((2, t, h, dk))
    return {"q": q, "k": k, "v": rng.standard_normal((t, h, dv))}


def _sequence(seed, n_chunks, seq="s", t=3):
    rng = np.random.default_rng(seed)
    return [Chunk(seq, i, _qkv(rng, t), final=i == n_chunks - 1) for i in range(n_chunks)]


def _attn(**kw):
    return CausalLinearAttention(backend="numpy", **kw)


def test_a_later_job_dead_letters_chunks_after_the_final_one(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    chunks = _sequence(SEED, 4)
    first = run_transform(chunks, _attn(checkpoint_dir=ckpt, checkpoint_every=2), tmp_path)
    assert first.dead == [] and len(first.results) == 4
    late = Chunk("s", 4, _qkv(np.random.default_rng(1), 3))
    second = run_transform(
        [late, *chunks], _attn(checkpoint_dir=ckpt, checkpoint_every=2, resume=True), tmp_path
    )
    assert [(d.chunk_index, d.reason) for d in second.dead] == [(4, "after_final")]
    assert "final chunk 3" in second.dead[0].message
    assert second.results == [] and second.counters.get("duplicates") == 4


def test_a_resent_chunk_with_other_content_is_a_conflicting_duplicate(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    chunks = _sequence(SEED + 1, 6)
    run_transform(chunks[:4], _attn(checkpoint_dir=ckpt, checkpoint_every=2), tmp_path)
    other = Chunk("s", 1, _qkv(np.random.default_rng(7), 3))  # index 1, other content
    early_other = Chunk("s", 5, _qkv(np.random.default_rng(8), 3), final=True)
    resumed = run_transform(
        [other, chunks[1], chunks[5], early_other, chunks[4]],
        _attn(checkpoint_dir=ckpt, checkpoint_every=2, resume=True),
        tmp_path,
    )
    reasons = sorted((d.chunk_index, d.reason) for d in resumed.dead)
    # chunk 1 (applied in the first job) and chunk 5 (buffered first in this one) conflict.
    assert reasons == [(1, "conflicting_duplicate"), (5, "conflicting_duplicate")]
    assert [r.index for r in resumed.results] == [4, 5]
    assert resumed.counters.get("duplicates") == 1  # the true resend of chunk 1


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


def test_oversized_chunks_are_refused_and_long_ones_run_in_blocks(tmp_path):
    rng = np.random.default_rng(SEED + 3)
    big = Chunk("a", 0, _qkv(rng, 40), final=True)
    huge = Chunk("b", 0, _qkv(rng, 101))
    small = [Chunk("c", i, _qkv(rng, 2), final=i == 1) for i in range(2)]
    t = _attn(max_chunk_tokens=100, block_tokens=16)
    run = run_transform([big, huge, *small], t, tmp_path)
    assert [(d.seq_id, d.reason) for d in run.dead] == [("b", "too_large")]
    assert "at most 100 tokens" in run.dead[0].message and "got 101" in run.dead[0].message
    assert {(r.seq_id, r.index) for r in run.results} == {("a", 0), ("c", 0), ("c", 1)}
    # A 40-token chunk in blocks of 16 gives what chunks of 16, 16 and 8 tokens give.
    pieces = [
        Chunk("a", j, {n: big.data[n][lo : lo + 16] for n in "qkv"})
        for j, lo in enumerate(range(0, 40, 16))
    ]
    split = run_transform(pieces, _attn(), tmp_path)
    blocked = next(r for r in run.results if r.seq_id == "a").output
    assert np.array_equal(blocked, np.concatenate([r.output for r in split.results]))


@pytest.mark.parametrize("fallback", [True])
def test_falling_back_past_a_corrupt_commit_rewrites_its_outputs_once(
    tmp_path, tiny_model_path, fallback
):
    import subprocess

    from _crash import embed_cmd
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


def test_buffer_index_keeps_digests_whole():
    from linstream.pipeline.stage.records import BufferIndex

    index = BufferIndex(None)
    digests = {i: bytes([i] * 15 + [0]) for i in (5, 3, 9)}  # trailing NUL bytes
    for i, d in digests.items():
        index.add(i, d)
    again = BufferIndex(index.pack())
    assert [again.find(i) for i in (3, 5, 9)] == [digests[3], digests[5], digests[9]]
    assert again.find(4) is None and again.run_from(3) == 1


def test_emit_sequence_is_the_mean_over_all_tokens_across_a_resume(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    chunks = _sequence(SEED + 5, 7) + _sequence(SEED + 6, 3, seq="u")
    per_token = run_transform(chunks, _attn(emit="tokens"), tmp_path)
    expected = {
        seq: np.concatenate([r.output for r in per_token.results if r.seq_id == seq]).mean(
            axis=0, dtype=np.float64
        )
        for seq in ("s", "u")
    }
    first = [c for c in chunks if c.index < (4 if c.seq_id == "s" else 2)]
    part = run_transform(
        first, _attn(emit="sequence", checkpoint_dir=ckpt, checkpoint_every=2), tmp_path
    )
    assert part.results == []  # no sequence finished yet
    rest = run_transform(
        chunks,
        _attn(emit="sequence", checkpoint_dir=ckpt, checkpoint_every=2, resume=True),
        tmp_path,
    )
    assert [(r.seq_id, r.index, r.start_position) for r in rest.results] == [
        ("s", 6, 0),
        ("u", 2, 0),
    ]
    for r in rest.results:
        # float32 outputs summed in float64: the mean agrees to float32 rounding of the outputs
        np.testing.assert_allclose(r.output, expected[r.seq_id], rtol=1e-6, atol=1e-7)
