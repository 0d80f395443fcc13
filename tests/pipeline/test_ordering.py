"""Shuffled, duplicated, randomly split chunks give one pass of the float64 oracle."""

from __future__ import annotations

import itertools

import numpy as np
from _beam_helpers import run_transform
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from linstream.ops import get_feature_map
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.state import CheckpointStore


def split_sequence(seq_id, q, k, v, rng, max_chunks=6):
    t = q.shape[0]
    n_cuts = int(rng.integers(0, min(max_chunks, t)))
    cuts = [0, *sorted(rng.choice(np.arange(1, t), size=n_cuts, replace=False).tolist()), t]
    return [
        Chunk(seq_id, i, {"q": q[a:b], "k": k[a:b], "v": v[a:b]}, final=b == t)
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
    ], cuts


# Each example runs a Beam job: few examples, no shrinking (the failing seed is printed).
@settings(
    max_examples=4,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1))
def test_shuffled_duplicated_chunks_equal_one_pass(seed, tmp_path):
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
    ckpt = str(tmp_path / f"ckpt-{seed}")
    run = run_transform(
        chunks,
        CausalLinearAttention(backend="numpy", checkpoint_dir=ckpt, checkpoint_every=2),
        tmp_path,
    )
    assert run.dead == []
    assert run.counters["duplicates"] == 3
    n_chunks = sum(len(c) - 1 for c in cuts.values())
    assert run.counters["chunks"] == n_chunks == len(run.results)
    for seq, (ref_out, ref_state) in refs.items():
        got = [r for r in run.results if r.seq_id == seq]
        assert [r.index for r in got] == list(range(len(cuts[seq]) - 1))
        assert [r.start_position for r in got] == cuts[seq][:-1]
        np.testing.assert_allclose(np.concatenate([r.output for r in got]), ref_out, atol=1e-12)
        final = CheckpointStore(ckpt).restore(seq, fingerprint=_fingerprint())
        assert final is not None and final.next_chunk == len(cuts[seq]) - 1
        np.testing.assert_allclose(final.S[0], ref_state.S, atol=1e-12)
        np.testing.assert_allclose(final.z[0], ref_state.z, atol=1e-12)


def _fingerprint():
    return CausalLinearAttention().step.fingerprint


def test_worked_example_through_the_pipeline(tmp_path):
    k = np.array([[1, 0], [0, 1], [1, 0]], float)[:, None, :]
    v = np.array([[2, 0], [0, 3], [1, 1]], float)[:, None, :]
    q = k.copy()
    chunks = [
        Chunk("w", 1, {"q": q[2:], "k": k[2:], "v": v[2:]}, final=True),
        Chunk("w", 0, {"q": q[:2], "k": k[:2], "v": v[:2]}),
    ]
    run = run_transform(chunks, CausalLinearAttention("identity", eps=0.0), tmp_path)
    np.testing.assert_allclose(run.results[1].output[0, 0], [1.5, 0.5])


def test_emit_mean_and_last(tmp_path):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 6, 1, 2))
    chunks = [Chunk("m", 0, {"q": q, "k": k, "v": v}, final=True)]
    full = run_transform(chunks, CausalLinearAttention(backend="numpy"), tmp_path).results[0]
    mean = run_transform(chunks, CausalLinearAttention(emit="mean"), tmp_path).results[0]
    last = run_transform(chunks, CausalLinearAttention(emit="last"), tmp_path).results[0]
    np.testing.assert_allclose(mean.output, full.output.mean(axis=0))
    np.testing.assert_allclose(last.output, full.output[-1])
