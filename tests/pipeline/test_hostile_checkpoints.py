"""A resume job over a store holding hostile files: each such sequence's chunk is a
`restore_failed` dead letter naming the problem, the other sequences go on, and nothing outside
the store is written or deleted."""

from __future__ import annotations

import os

import numpy as np
from _beam_helpers import run_transform
from helpers.store_faults import HOSTILE_CASES, make_hostile_commit, random_state
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.stage.steps import RawAttentionStep
from linstream.state import CheckpointStore

SEED = 20261201
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
    print(f"seed={SEED}")
    assert set(WORDS) == set(HOSTILE_CASES)
    rng = np.random.default_rng(SEED)
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

    run = run_transform(
        [chunk(s) for s in [*sorted(HOSTILE_CASES), "good", "wrong_shape"]],
        CausalLinearAttention(backend="numpy", checkpoint_dir=ckpt, resume=True),
        tmp_path,
    )
    assert [(r.seq_id, r.index) for r in run.results] == [("good", 1)]
    got = {d.seq_id: d for d in run.dead}
    assert sorted(got) == sorted([*HOSTILE_CASES, "wrong_shape"])
    for case, words in [*WORDS.items(), ("wrong_shape", "layers 2 (model 1)")]:
        d = got[case]
        assert (d.chunk_index, d.reason) == (1, "restore_failed"), d
        assert words in d.message, (case, d.message)
    assert _files(outside) == before, "the job wrote or deleted outside the store"
