"""A corrupt newest checkpoint: dead letters by default, the previous commit only when asked."""

from __future__ import annotations

import numpy as np
from _beam_helpers import run_transform
from helpers.store_faults import flip_bit
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk
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

    first = run_transform(_chunks(q, k, v, range(3), n, size), transform(), tmp_path)
    assert len(first.results) == 3 and not first.dead
    store = CheckpointStore(ckpt)
    newest = store.commits("s")[0]
    assert newest.next_chunk == 3
    assert newest.data_path is not None and newest.size is not None
    flip_bit(newest.data_path, newest.size // 2)

    refused = run_transform(
        _chunks(q, k, v, [3], n, size), transform(resume=True), tmp_path / "refused"
    )
    assert not refused.results
    assert [(d.seq_id, d.chunk_index, d.reason) for d in refused.dead] == [
        ("s", 3, "restore_failed")
    ]

    resumed = run_transform(
        _chunks(q, k, v, [2, 3], n, size),
        transform(resume=True, restore_fallback=True),
        tmp_path / "resumed",
    )
    assert not resumed.dead
    assert [r.index for r in resumed.results] == [2, 3]
    ref, _ = causal_recurrent(q, k, v, eps=1e-6)
    for r in resumed.results:
        np.testing.assert_allclose(r.output, ref[r.index * size : (r.index + 1) * size], atol=1e-12)
