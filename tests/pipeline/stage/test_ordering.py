"""The stage orders a sequence's chunks: shuffled, duplicated, randomly split chunks give one pass
of the float64 oracle; early chunks wait, late ones after the final chunk and conflicting resends
are dead letters.  Driven without a runner (tests/helpers/stage_runs.py)."""

from __future__ import annotations

import itertools

import numpy as np
from helpers.stage_runs import StageRun, run_stage
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.ops import get_feature_map
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.state import CheckpointStore

SEED = 20261201


def split_sequence(seq_id, q, k, v, rng, max_chunks=6):
    t = q.shape[0]
    n_cuts = int(rng.integers(0, min(max_chunks, t)))
    cuts = [0, *sorted(rng.choice(np.arange(1, t), size=n_cuts, replace=False).tolist()), t]
    return [
        Chunk(seq_id, i, {"q": q[a:b], "k": k[a:b], "v": v[a:b]}, final=b == t)
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
    ], cuts


def _qkv(rng, t, h=2, dk=3, dv=2):
    q, k = rng.standard_normal((2, t, h, dk))
    return {"q": q, "k": k, "v": rng.standard_normal((t, h, dv))}


def _sequence(seed, n_chunks, seq="s", t=3):
    rng = np.random.default_rng(seed)
    return [Chunk(seq, i, _qkv(rng, t), final=i == n_chunks - 1) for i in range(n_chunks)]


def _attn(**kw):
    return CausalLinearAttention(backend="numpy", **kw)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_shuffled_duplicated_chunks_equal_one_pass(seed, tmp_path_factory):
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    fm = get_feature_map("elu+1")
    chunks, refs, cuts = [], {}, {}
    for s in range(3):
        t = int(rng.integers(1, 50))
        h, dk, dv = 2, 3, int(rng.integers(1, 5))
        q, k = rng.standard_normal((2, t, h, dk))
        v = rng.standard_normal((t, h, dv))
        seq_chunks, cuts[f"s{s}"] = split_sequence(f"s{s}", q, k, v, rng)
        chunks += seq_chunks
        refs[f"s{s}"] = causal_recurrent(q, k, v, feature_map=fm, eps=1e-6)
    dups = [chunks[int(i)] for i in rng.integers(0, len(chunks), size=3)]
    chunks = [chunks[int(i)] for i in rng.permutation(len(chunks))] + dups
    chunks = [chunks[int(i)] for i in rng.permutation(len(chunks))]
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    run = run_stage(chunks, _attn(checkpoint_dir=ckpt, checkpoint_every=2))
    assert run.dead == []
    assert run.counters["duplicates"] == 3
    n_chunks = sum(len(c) - 1 for c in cuts.values())
    assert run.counters["chunks"] == n_chunks == len(run.results)
    fingerprint = CausalLinearAttention().step.fingerprint
    for seq, (ref_out, ref_state) in refs.items():
        got = [r for r in run.results if r.seq_id == seq]
        assert [r.index for r in got] == list(range(len(cuts[seq]) - 1))
        assert [r.start_position for r in got] == cuts[seq][:-1]
        np.testing.assert_allclose(np.concatenate([r.output for r in got]), ref_out, atol=1e-12)
        final = CheckpointStore(ckpt).restore(seq, fingerprint=fingerprint)
        assert final is not None and final.next_chunk == len(cuts[seq]) - 1
        np.testing.assert_allclose(final.S[0], ref_state.S, atol=1e-12)
        np.testing.assert_allclose(final.z[0], ref_state.z, atol=1e-12)


def test_worked_example():
    k = np.array([[1, 0], [0, 1], [1, 0]], float)[:, None, :]
    v = np.array([[2, 0], [0, 3], [1, 1]], float)[:, None, :]
    q = k.copy()
    chunks = [
        Chunk("w", 1, {"q": q[2:], "k": k[2:], "v": v[2:]}, final=True),
        Chunk("w", 0, {"q": q[:2], "k": k[:2], "v": v[:2]}),
    ]
    run = run_stage(chunks, CausalLinearAttention("identity", eps=0.0))
    np.testing.assert_allclose(run.results[1].output[0, 0], [1.5, 0.5])


def test_emit_mean_and_last():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 6, 1, 2))
    chunks = [Chunk("m", 0, {"q": q, "k": k, "v": v}, final=True)]
    full = run_stage(chunks, CausalLinearAttention(backend="numpy")).results[0]
    mean = run_stage(chunks, CausalLinearAttention(emit="mean")).results[0]
    last = run_stage(chunks, CausalLinearAttention(emit="last")).results[0]
    np.testing.assert_allclose(mean.output, full.output.mean(axis=0))
    np.testing.assert_allclose(last.output, full.output[-1])


def test_chunk_after_final_and_conflicting_final():
    rng = np.random.default_rng(3)
    chunks = [
        Chunk("a", 0, _qkv(rng, 2)),
        Chunk("a", 1, _qkv(rng, 2), final=True),
        Chunk("a", 2, _qkv(rng, 2)),  # after the final chunk
        Chunk("b", 2, _qkv(rng, 2), final=True),
        Chunk("b", 3, _qkv(rng, 2)),  # after a final chunk that is still buffered
        Chunk("b", 0, _qkv(rng, 2)),
        Chunk("b", 1, _qkv(rng, 2)),
    ]
    run = run_stage(chunks, _attn())
    assert sorted((d.seq_id, d.chunk_index, d.reason) for d in run.dead) == [
        ("a", 2, "after_final"),
        ("b", 3, "after_final"),
    ]
    assert [(r.seq_id, r.index) for r in run.results] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
        ("b", 2),
    ]


def test_gap_left_at_end_of_input_is_reported():
    rng = np.random.default_rng(3)
    chunks = [
        Chunk("g", 0, _qkv(rng, 2)),
        Chunk("g", 2, _qkv(rng, 2)),
        Chunk("g", 3, _qkv(rng, 2), final=True),
    ]
    run = run_stage(chunks, _attn())
    assert [(d.chunk_index, d.reason) for d in run.dead] == [(2, "gap"), (3, "gap")]
    assert "waited for chunk 1" in run.dead[0].message
    assert run.counters["gaps"] >= 1 and run.counters["buffered"] == 2
    assert [r.index for r in run.results] == [0]


@settings(max_examples=6, deadline=None)
@given(order=st.permutations([0, 1, 2]))
def test_chunk_after_the_final_one_is_never_applied(order):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((6, 2, 3)) for _ in range(3))
    parts = [(q[i * 2 : i * 2 + 2], k[i * 2 : i * 2 + 2], v[i * 2 : i * 2 + 2]) for i in range(3)]
    chunks = [Chunk("f", i, dict(zip("qkv", parts[i], strict=True)), final=i == 1) for i in order]
    run = run_stage(chunks, CausalLinearAttention(backend="numpy", eps=1e-6))
    assert sorted(run.by_key()) == [("f", 0), ("f", 1)]
    assert [(d.chunk_index, d.reason) for d in run.dead] == [(2, "after_final")]
    ref, _ = causal_recurrent(q[:4], k[:4], v[:4], eps=1e-6)
    got = np.concatenate([run.by_key()["f", i].output for i in range(2)])
    np.testing.assert_allclose(got, ref)


def test_a_later_job_dead_letters_chunks_after_the_final_one(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    chunks = _sequence(SEED, 4)
    first = run_stage(chunks, _attn(checkpoint_dir=ckpt, checkpoint_every=2))
    assert first.dead == [] and len(first.results) == 4
    late = Chunk("s", 4, _qkv(np.random.default_rng(1), 3))
    second = run_stage([late, *chunks], _attn(checkpoint_dir=ckpt, checkpoint_every=2, resume=True))
    assert [(d.chunk_index, d.reason) for d in second.dead] == [(4, "after_final")]
    assert "final chunk 3" in second.dead[0].message
    assert second.results == [] and second.counters.get("duplicates") == 4


def test_a_resent_chunk_with_other_content_is_a_conflicting_duplicate(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    chunks = _sequence(SEED + 1, 6)
    run_stage(chunks[:4], _attn(checkpoint_dir=ckpt, checkpoint_every=2))
    other = Chunk("s", 1, _qkv(np.random.default_rng(7), 3))  # index 1, other content
    early_other = Chunk("s", 5, _qkv(np.random.default_rng(8), 3), final=True)
    resumed = run_stage(
        [other, chunks[1], chunks[5], early_other, chunks[4]],
        _attn(checkpoint_dir=ckpt, checkpoint_every=2, resume=True),
    )
    reasons = sorted((d.chunk_index, d.reason) for d in resumed.dead)
    # chunk 1 (applied in the first job) and chunk 5 (buffered first in this one) conflict.
    assert reasons == [(1, "conflicting_duplicate"), (5, "conflicting_duplicate")]
    assert [r.index for r in resumed.results] == [4, 5]
    assert resumed.counters.get("duplicates") == 1  # the true resend of chunk 1


def test_oversized_chunks_are_refused_and_long_ones_run_in_blocks():
    rng = np.random.default_rng(SEED + 3)
    big = Chunk("a", 0, _qkv(rng, 40), final=True)
    huge = Chunk("b", 0, _qkv(rng, 101))
    small = [Chunk("c", i, _qkv(rng, 2), final=i == 1) for i in range(2)]
    run = run_stage([big, huge, *small], _attn(max_chunk_tokens=100, block_tokens=16))
    assert [(d.seq_id, d.reason) for d in run.dead] == [("b", "too_large")]
    assert "at most 100 tokens" in run.dead[0].message and "got 101" in run.dead[0].message
    assert {(r.seq_id, r.index) for r in run.results} == {("a", 0), ("c", 0), ("c", 1)}
    # A 40-token chunk in blocks of 16 gives what chunks of 16, 16 and 8 tokens give.
    pieces = [
        Chunk("a", j, {n: big.data[n][lo : lo + 16] for n in "qkv"})
        for j, lo in enumerate(range(0, 40, 16))
    ]
    split = run_stage(pieces, _attn())
    blocked = next(r for r in run.results if r.seq_id == "a").output
    assert np.array_equal(blocked, np.concatenate([r.output for r in split.results]))


def test_emit_sequence_is_the_mean_over_all_tokens_across_a_resume(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    chunks = _sequence(SEED + 5, 7) + _sequence(SEED + 6, 3, seq="u")
    per_token = run_stage(chunks, _attn(emit="tokens"))
    expected = {
        seq: np.concatenate([r.output for r in per_token.results if r.seq_id == seq]).mean(
            axis=0, dtype=np.float64
        )
        for seq in ("s", "u")
    }
    first = [c for c in chunks if c.index < (4 if c.seq_id == "s" else 2)]
    part = run_stage(first, _attn(emit="sequence", checkpoint_dir=ckpt, checkpoint_every=2))
    assert part.results == []  # no sequence finished yet
    rest = run_stage(
        chunks, _attn(emit="sequence", checkpoint_dir=ckpt, checkpoint_every=2, resume=True)
    )
    assert [(r.seq_id, r.index, r.start_position) for r in rest.results] == [
        ("s", 6, 0),
        ("u", 2, 0),
    ]
    for r in rest.results:
        # float32 outputs summed in float64: the mean agrees to float32 rounding of the outputs
        np.testing.assert_allclose(r.output, expected[r.seq_id], rtol=1e-6, atol=1e-7)


def test_the_buffer_bound_dead_letters_chunks_too_far_ahead():
    rng = np.random.default_rng(SEED + 7)
    chunks = [Chunk("s", i, _qkv(rng, 2), final=i == 5) for i in range(6)]
    job = StageRun(_attn(max_buffered_chunks=2))
    assert job.send(chunks[2]) == []  # two ahead of chunk 0: buffered
    (dead,) = job.send(chunks[3])  # three ahead: refused
    assert (dead.chunk_index, dead.reason) == (3, "beyond_buffer")
    assert "expected a chunk index below 3" in dead.message
    assert [r.index for r in job.send(chunks[0])] == [0]  # 1 is still missing
    assert [r.index for r in job.send(chunks[1])] == [1, 2]  # the buffered 2 follows
    for c in chunks[3:]:
        job.send(c)
    run = job.finish()
    assert [r.index for r in run.results] == list(range(6)) and len(run.dead) == 1
    assert run.counters["buffered"] == 1 and run.counters["gaps"] == 1
