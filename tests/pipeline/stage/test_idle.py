"""A sequence that goes idle: its timer is set once per target, the timer commits it, clears its
state and reports chunks stuck behind a gap, and the sequence is restored from the store when it
returns.  Driven without a runner, with event times chosen by the test."""

from __future__ import annotations

import numpy as np
from apache_beam.utils.timestamp import Timestamp
from helpers.stage_runs import StageRun
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.state import CheckpointStore

SEED = 11


def _chunks(rng, seq, n, t=3):
    q, k, v = rng.standard_normal((3, n * t, 2, 4))
    chunks = [
        Chunk(
            seq,
            i,
            {"q": q[t * i : t * (i + 1)], "k": k[t * i : t * (i + 1)], "v": v[t * i : t * (i + 1)]},
            final=i == n - 1,
        )
        for i in range(n)
    ]
    return chunks, causal_recurrent(q, k, v, eps=1e-6)[0]


def test_the_timer_is_set_once_per_target_and_again_after_it_fires(tmp_path):
    rng = np.random.default_rng(SEED)
    chunks, _ = _chunks(rng, "a", 4)
    job = StageRun(
        CausalLinearAttention(backend="numpy", checkpoint_dir=str(tmp_path), idle_timeout=10)
    )
    timer = None
    sets = []
    for i, at in ((0, 1.0), (1, 1.0), (2, 5.0)):
        job.send(chunks[i], at=at)
        timer = job.keys["a"].timer
        sets.append(timer.when)
    assert sets == [Timestamp.of(11), Timestamp.of(11), Timestamp.of(15)]
    timer.when = Timestamp.of(0)  # a stale value: the stage must not set the same target again
    job.send(chunks[2], at=5.0)  # a resend with the same time: the target does not move
    assert timer.when == Timestamp.of(0)
    job.advance_to(15)
    assert timer.when is None
    job.send(chunks[3], at=6.0)  # after the timer fired, the next element sets it again
    assert timer.when == Timestamp.of(16)
    run = job.finish()
    assert [r.index for r in run.results] == [0, 1, 2, 3] and run.dead == []


def test_an_idle_sequence_is_committed_evicted_and_restored_when_it_returns(tmp_path):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    a, ref_a = _chunks(rng, "a", 5)
    b, ref_b = _chunks(rng, "b", 2)
    ckpt = str(tmp_path / "ckpt")
    job = StageRun(
        CausalLinearAttention(
            backend="numpy", checkpoint_dir=ckpt, checkpoint_every=100, idle_timeout=10
        )
    )
    job.send(a[2], at=1)
    job.send(a[0], at=2)
    job.send(b[0], at=2)
    job.advance_to(5)
    job.send(a[1], at=6)  # applies 1, then the buffered 2
    job.send(a[1], at=6)  # a duplicate
    job.advance_to(100)  # both idle past the timeout: committed, then evicted
    assert job.metrics.counts["evictions"] == 2
    job.send(a[4], at=101)  # returns out of order: restored, 4 buffered
    job.send(a[3], at=102)
    job.send(b[1], at=102)
    run = job.finish()
    assert run.dead == []
    for s, ref in (("a", ref_a), ("b", ref_b)):
        got = [r for r in run.results if r.seq_id == s]
        assert [r.index for r in got] == list(range(len(got)))
        np.testing.assert_allclose(np.concatenate([r.output for r in got]), ref, atol=1e-12)
    assert run.counters["evictions"] == 4 and run.counters["restores"] == 2
    assert run.counters["duplicates"] == 1 and run.counters["buffered"] == 2
    store = CheckpointStore(ckpt)
    positions = {s: sorted(c.position for c in store.commits(s)) for s in ("a", "b")}
    assert positions == {"a": [9, 15], "b": [3, 6]}, positions


def test_chunks_dead_lettered_behind_a_gap_wait_for_their_resend(tmp_path):
    """The gap's dead letters tell the user to resend: when the missing chunk comes, the chunks
    reported behind it are not applied from the old buffer, only when they are sent again."""
    rng = np.random.default_rng(SEED)
    chunks, ref = _chunks(rng, "g", 4)
    for store in (None, str(tmp_path / "ckpt")):
        job = StageRun(CausalLinearAttention(backend="numpy", checkpoint_dir=store))
        for i in (0, 2, 3):
            job.send(chunks[i], at=1)
        gap = job.advance_to(1000)
        assert [(d.chunk_index, d.reason) for d in gap] == [(2, "gap"), (3, "gap")], store
        assert [r.index for r in job.send(chunks[1], at=1001)] == [1], store
        assert [r.index for r in job.send(chunks[2], at=1002)] == [2], store
        assert [r.index for r in job.send(chunks[3], at=1003)] == [3], store
        run = job.finish()
        got = np.concatenate([r.output for r in run.results])
        np.testing.assert_allclose(got, ref, atol=1e-12)
