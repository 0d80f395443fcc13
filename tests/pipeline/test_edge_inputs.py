"""Inputs that pass the shape checks but still must not stop the job or change other sequences."""

from __future__ import annotations

import numpy as np
from _beam_helpers import run_transform
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk

SEED = 7


def _qkv(rng, t, h=2, d=3):
    return tuple(rng.standard_normal((t, h, d)) for _ in range(3))


def _chunk(seq, i, q, k, v, final=False):
    return Chunk(seq, i, {"q": q, "k": k, "v": v}, final=final)


def _transform():
    return CausalLinearAttention(backend="numpy", eps=1e-6)


def test_overflowing_chunk_is_dead_lettered_and_other_sequences_unchanged(tmp_path):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    qa, ka, va = _qkv(rng, 4)
    qb, kb, vb = _qkv(rng, 6)
    huge = np.full((3, 2, 3), 1e200)
    chunks = [
        _chunk("a", 0, qa, ka, va),
        _chunk("a", 1, huge, huge, huge, final=True),
        _chunk("b", 0, qb[:3], kb[:3], vb[:3]),
        _chunk("b", 1, qb[3:], kb[3:], vb[3:], final=True),
    ]
    run = run_transform(chunks, _transform(), tmp_path)
    assert ("a", 1, "non_finite") in [(d.seq_id, d.chunk_index, d.reason) for d in run.dead]
    got = run.by_key()
    assert set(got) == {("a", 0), ("b", 0), ("b", 1)}
    ref_b, _ = causal_recurrent(qb, kb, vb, eps=1e-6)
    np.testing.assert_allclose(np.concatenate([got["b", 0].output, got["b", 1].output]), ref_b)
    ref_a, _ = causal_recurrent(qa, ka, va, eps=1e-6)
    np.testing.assert_allclose(got["a", 0].output, ref_a)


def test_zero_sized_dimension_is_dead_lettered(tmp_path):
    rng = np.random.default_rng(SEED)
    q, k, v = _qkv(rng, 2)
    empty_width = np.zeros((2, 1, 0))
    chunks = [
        _chunk("z", 0, empty_width, empty_width, empty_width, final=True),
        _chunk("ok", 0, q, k, v, final=True),
    ]
    run = run_transform(chunks, _transform(), tmp_path)
    assert [(d.seq_id, d.chunk_index) for d in run.dead] == [("z", 0)]
    assert set(run.by_key()) == {("ok", 0)}


@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(order=st.permutations([0, 1, 2]))
def test_chunk_after_the_final_one_is_never_applied(order, tmp_path_factory):
    rng = np.random.default_rng(SEED)
    q, k, v = _qkv(rng, 6)
    parts = [(q[i * 2 : i * 2 + 2], k[i * 2 : i * 2 + 2], v[i * 2 : i * 2 + 2]) for i in range(3)]
    chunks = [_chunk("f", i, *parts[i], final=i == 1) for i in order]
    run = run_transform(chunks, _transform(), tmp_path_factory.mktemp("run"))
    assert sorted(run.by_key()) == [("f", 0), ("f", 1)]
    assert [(d.chunk_index, d.reason) for d in run.dead] == [(2, "after_final")]
    ref, _ = causal_recurrent(q[:4], k[:4], v[:4], eps=1e-6)
    got = np.concatenate([run.by_key()["f", i].output for i in range(2)])
    np.testing.assert_allclose(got, ref)
