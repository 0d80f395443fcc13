"""Restoring a sequence from the store: a corrupt newest commit is a dead letter unless the
fallback is asked for, and a store holding hostile files dead-letters each such sequence (naming
the problem) while the others go on and nothing outside the store changes.  Driven without a
runner (tests/helpers/stage_runs.py)."""

from __future__ import annotations

import os

import numpy as np
from helpers.stage_runs import run_stage
from helpers.store_faults import HOSTILE_CASES, flip_bit, make_hostile_commit, random_state
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.stage.steps import RawAttentionStep
from linstream.state import CheckpointStore

SEED = 20261130


def _chunks(q, k, v, indices, n_chunks, size):
    return [
        Chunk(
            "s",
            i,
            {
                "q": q[i * size : (i + 1) * size],
                "k": k[i * size : (i + 1) * size],
                "v": v[i * size : (i + 1) * size],
            },
            final=i == n_chunks - 1,
        )
        for i in indices
    ]


def test_corrupt_newest_commit_dead_letters_unless_fallback_is_asked(tmp_path):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    size, n = 5, 4
    q, k, v = (rng.standard_normal((size * n, 2, 3)) for _ in range(3))
    ckpt = str(tmp_path / "ckpt")

    def transform(**kw):
        return CausalLinearAttention(
            backend="numpy", checkpoint_dir=ckpt, checkpoint_every=1, eps=1e-6, **kw
        )

    first = run_stage(_chunks(q, k, v, range(3), n, size), transform())
    assert len(first.results) == 3 and not first.dead
    store = CheckpointStore(ckpt)
    newest = store.commits("s")[0]
    assert newest.next_chunk == 3
    assert newest.data_path is not None and newest.size is not None
    flip_bit(newest.data_path, newest.size // 2)

    refused = run_stage(_chunks(q, k, v, [3], n, size), transform(resume=True))
    assert not refused.results
    assert [(d.seq_id, d.chunk_index, d.reason) for d in refused.dead] == [
        ("s", 3, "restore_failed")
    ]

    resumed = run_stage(
        _chunks(q, k, v, [2, 3], n, size), transform(resume=True, restore_fallback=True)
    )
    assert not resumed.dead
    assert [r.index for r in resumed.results] == [2, 3]
    ref, _ = causal_recurrent(q, k, v, eps=1e-6)
    for r in resumed.results:
        np.testing.assert_allclose(r.output, ref[r.index * size : (r.index + 1) * size], atol=1e-12)


HOSTILE_SEED = 20261201
WORDS = {
    "deep_manifest": "nested deeper than",
    "huge_int_manifest": "a number of 5000 characters",
    "manifest_is_dir": "expected a regular file, found a directory",
    "data_is_dir": "expected a regular file, found a directory",
    "manifest_is_fifo": "expected a regular file, found a FIFO",
    "data_is_fifo": "expected a regular file, found a FIFO",
    "linked_folder": "symbolic link",
    "linked_manifest": "symbolic link",
    "linked_data": "symbolic link",
    "compressed_bomb": "compressed",
}


def _files(folder: str) -> dict[str, tuple[int, float]]:
    out = {}
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime)
    return out


def test_resume_over_hostile_checkpoints_dead_letters_each_and_goes_on(tmp_path):
    print(f"seed={HOSTILE_SEED}")
    assert set(WORDS) == set(HOSTILE_CASES)
    rng = np.random.default_rng(HOSTILE_SEED)
    ckpt, outside = str(tmp_path / "ckpt"), str(tmp_path / "outside")
    os.makedirs(outside)
    fp = RawAttentionStep("elu+1", 1e-6).fingerprint
    shape = (1, 2, 3, 4)  # one layer, H=2, d_k=3 features (elu+1), d_v=4
    for i, case in enumerate(sorted(HOSTILE_CASES)):
        st = random_state(i, shape, seq_id=case, position=5, next_chunk=1, fingerprint=fp)
        make_hostile_commit(ckpt, st, case, os.path.join(outside, case))
    CheckpointStore(ckpt).commit(
        random_state(99, shape, seq_id="good", position=5, next_chunk=1, fingerprint=fp)
    )
    # Well formed, right model fingerprint, but two layers where the step carries one.
    CheckpointStore(ckpt).commit(
        random_state(
            98, (2, 2, 3, 4), seq_id="wrong_shape", position=5, next_chunk=1, fingerprint=fp
        )
    )
    before = _files(outside)

    def chunk(seq_id: str) -> Chunk:
        q, k = rng.standard_normal((2, 4, 2, 3))
        v = rng.standard_normal((4, 2, 4))
        return Chunk(seq_id, 1, {"q": q, "k": k, "v": v}, final=True)

    run = run_stage(
        [chunk(s) for s in [*sorted(HOSTILE_CASES), "good", "wrong_shape"]],
        CausalLinearAttention(backend="numpy", checkpoint_dir=ckpt, resume=True),
    )
    assert [(r.seq_id, r.index) for r in run.results] == [("good", 1)]
    got = {d.seq_id: d for d in run.dead}
    assert sorted(got) == sorted([*HOSTILE_CASES, "wrong_shape"])
    for case, words in [*WORDS.items(), ("wrong_shape", "layers 2 (model 1)")]:
        d = got[case]
        assert (d.chunk_index, d.reason) == (1, "restore_failed"), d
        assert words in d.message, (case, d.message)
    assert _files(outside) == before, "the job wrote or deleted outside the store"


def test_a_checkpoint_made_with_another_emit_cannot_give_the_sequences_mean(tmp_path):
    """emit="sequence" forms the mean from a running sum the commits carry; a checkpoint made
    with emit="mean" has none, so resuming it with "sequence" dead-letters the chunk (the mean
    of the new chunks alone would be wrong), while resuming it with "mean" goes on."""
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    size, n = 5, 4
    q, k, v = (rng.standard_normal((size * n, 2, 3)) for _ in range(3))
    ckpt = str(tmp_path / "ckpt")

    def transform(**kw):
        return CausalLinearAttention(backend="numpy", checkpoint_dir=ckpt, checkpoint_every=1, **kw)

    first = run_stage(_chunks(q, k, v, range(2), n, size), transform(emit="mean"))
    assert len(first.results) == 2 and not first.dead
    rest = _chunks(q, k, v, range(2, n), n, size)
    refused = run_stage(rest, transform(emit="sequence", resume=True))
    assert not refused.results
    assert [(d.chunk_index, d.reason) for d in refused.dead] == [
        (2, "restore_failed"),
        (3, "restore_failed"),
    ]
    assert "made with another emit than 'sequence'" in refused.dead[0].message
    went_on = run_stage(rest, transform(emit="mean", resume=True))
    assert [r.index for r in went_on.results] == [2, 3] and not went_on.dead
