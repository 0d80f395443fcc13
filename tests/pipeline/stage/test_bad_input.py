"""Bad input goes to the dead letters with sequence, chunk and reason; nothing else changes.
Driven without a runner (tests/helpers/stage_runs.py)."""

from __future__ import annotations

import numpy as np
from helpers.stage_runs import run_stage
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk, EmbedSequences

RNG = np.random.default_rng(3)
SEED = 7


def qkv(t, h=2, d=3, dtype=np.float64):
    q, k, v = RNG.standard_normal((3, t, h, d)).astype(dtype)
    return {"q": q, "k": k, "v": v}


GOOD = [Chunk("ok", i, qkv(4), final=i == 2) for i in range(3)]
BAD_FIRST = qkv(4)  # chunk 0 of "bad" is valid; the bad chunks are 1..


def with_nan():
    d = qkv(4)
    d["k"][2, 1, 0] = np.nan
    return d


def with_inf():
    d = qkv(4)
    d["v"][0, 0, 0] = np.inf
    return d


RAW_CASES = {
    "wrong-shape": (Chunk("bad", 1, {**qkv(4), "v": np.zeros((3, 2, 3))}), "bad_shape"),
    "wrong-rank": (Chunk("bad", 1, {**qkv(4), "q": np.zeros((4, 6))}), "bad_shape"),
    "other-heads": (Chunk("bad", 1, qkv(4, h=3)), "bad_shape"),
    "int-dtype": (Chunk("bad", 1, {**qkv(4), "q": np.ones((4, 2, 3), np.int64)}), "bad_dtype"),
    "ragged": (Chunk("bad", 1, {**qkv(4), "q": [[1.0], [2.0, 3.0]]}), "bad_dtype"),
    "missing-key": (Chunk("bad", 1, {"q": np.zeros((4, 2, 3))}), "bad_payload"),
    "not-a-mapping": (Chunk("bad", 1, np.zeros((4, 2, 3))), "bad_payload"),
    "nan": (Chunk("bad", 1, with_nan()), "non_finite"),
    "inf": (Chunk("bad", 1, with_inf()), "non_finite"),
    "negative-index": (Chunk("bad", -1, qkv(4)), "bad_index"),
    "float-index": (Chunk("bad", 1.5, qkv(4)), "bad_index"),
    "string-index": (Chunk("bad", "1", qkv(4)), "bad_index"),
    "empty": (Chunk("bad", 1, qkv(0)), "empty_chunk"),
    "beyond-buffer": (Chunk("bad", 10, qkv(4)), "beyond_buffer"),
}


def raw_bad_chunks() -> list[Chunk]:
    """GOOD, then for every case a sequence "bad-<case>" with a valid chunk 0 and the bad chunk."""
    chunks = list(GOOD)
    for case, (bad, _reason) in RAW_CASES.items():
        chunks += [Chunk(f"bad-{case}", 0, BAD_FIRST), Chunk(f"bad-{case}", bad.index, bad.data)]
    return chunks


def test_raw_bad_input_is_dead_lettered():
    """Every case in one job: sequence "bad-<case>" gets a valid chunk 0 and the bad chunk."""
    clean = run_stage(GOOD, CausalLinearAttention(backend="numpy")).results
    run = run_stage(raw_bad_chunks(), CausalLinearAttention(backend="numpy", max_buffered_chunks=4))
    got = {d.seq_id: d for d in run.dead}
    assert sorted(got) == sorted(f"bad-{case}" for case in RAW_CASES)
    assert len(run.dead) == len(RAW_CASES)
    for case, (bad, reason) in RAW_CASES.items():
        d = got[f"bad-{case}"]
        assert d.reason == reason, (case, d)
        assert d.chunk_index == (bad.index if isinstance(bad.index, int) else None), (case, d)
        assert f"sequence 'bad-{case}'" in d.message and "expected" in d.message, d.message
        assert run.counters[f"dead_letters.{reason}"] == sum(
            r == reason for _, r in RAW_CASES.values()
        )
    assert run.counters["dead_letters"] == len(RAW_CASES)
    # The other sequence is untouched, and so is each bad sequence's valid chunk 0.
    assert [r for r in run.results if r.seq_id == "ok"] == clean
    assert sorted((r.seq_id, r.index) for r in run.results if r.seq_id != "ok") == sorted(
        (f"bad-{case}", 0) for case in RAW_CASES
    )


def test_embed_bad_tokens(tiny_model_path):
    from linstream.ops import load_model

    model = tiny_model_path
    vocab = load_model(model).config.vocab_size
    good = [Chunk("ok", i, np.arange(i, i + 5, dtype=np.int32), final=i == 1) for i in range(2)]
    bad = [
        (Chunk("t1", 0, np.array([1, vocab], np.int32)), "unknown_token"),
        (Chunk("t2", 0, np.array([-1, 2], np.int64)), "unknown_token"),
        (Chunk("t3", 0, np.array([1.0, 2.0])), "bad_dtype"),
        (Chunk("t4", 0, np.zeros((2, 2), np.int32)), "bad_shape"),
        (Chunk("t5", 0, np.zeros(0, np.int32)), "empty_chunk"),
        (Chunk("t6", 0, None), "bad_dtype"),
    ]
    clean = run_stage(good, EmbedSequences(model, backend="numpy"))
    run = run_stage(good + [c for c, _ in bad], EmbedSequences(model, backend="numpy"))
    assert sorted((d.seq_id, d.reason) for d in run.dead) == sorted((c.seq_id, r) for c, r in bad)
    assert run.results == clean.results
    assert run.counters["dead_letters"] == len(bad)


def test_embed_features_model_and_its_bad_input(tmp_path):
    from linstream.ops.model.config import ModelConfig
    from linstream.ops.model.weights import init_weights, write_model

    cfg = ModelConfig(
        input_kind="features",
        vocab_size=None,
        input_dim=3,
        d_model=8,
        n_layers=1,
        n_heads=2,
        d_head=4,
        d_ff=16,
    )
    path = str(tmp_path / "feat.safetensors")
    write_model(path, cfg, init_weights(cfg, 1))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    nan = x.copy()
    nan[1, 2] = np.nan
    chunks = [
        Chunk("f", 1, x[3:], final=True),
        Chunk("f", 0, x[:3]),
        Chunk("g", 0, nan),
        Chunk("h", 0, np.zeros((2, 4), np.float32)),
        Chunk("i", 0, np.zeros((2, 3), np.int32)),
    ]
    run = run_stage(chunks, EmbedSequences(path, backend="numpy", emit="tokens"))
    assert sorted((d.seq_id, d.reason) for d in run.dead) == [
        ("g", "non_finite"),
        ("h", "bad_shape"),
        ("i", "bad_dtype"),
    ]
    whole = run_stage(
        [Chunk("f", 0, x, final=True)], EmbedSequences(path, backend="numpy", emit="tokens")
    )
    got = np.concatenate([r.output for r in run.results])
    np.testing.assert_allclose(got, whole.results[0].output, rtol=1e-5, atol=1e-5)
    assert [r.start_position for r in run.results] == [0, 3]


def _qkv(rng, t, h=2, d=3):
    return tuple(rng.standard_normal((t, h, d)) for _ in range(3))


def _chunk(seq, i, q, k, v, final=False):
    return Chunk(seq, i, {"q": q, "k": k, "v": v}, final=final)


def test_overflowing_chunk_is_dead_lettered_and_other_sequences_unchanged():
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
    run = run_stage(chunks, CausalLinearAttention(backend="numpy", eps=1e-6))
    assert ("a", 1, "non_finite") in [(d.seq_id, d.chunk_index, d.reason) for d in run.dead]
    got = run.by_key()
    assert set(got) == {("a", 0), ("b", 0), ("b", 1)}
    ref_b, _ = causal_recurrent(qb, kb, vb, eps=1e-6)
    np.testing.assert_allclose(np.concatenate([got["b", 0].output, got["b", 1].output]), ref_b)
    ref_a, _ = causal_recurrent(qa, ka, va, eps=1e-6)
    np.testing.assert_allclose(got["a", 0].output, ref_a)


def test_zero_sized_dimension_is_dead_lettered():
    rng = np.random.default_rng(SEED)
    q, k, v = _qkv(rng, 2)
    empty_width = np.zeros((2, 1, 0))
    chunks = [
        _chunk("z", 0, empty_width, empty_width, empty_width, final=True),
        _chunk("ok", 0, q, k, v, final=True),
    ]
    run = run_stage(chunks, CausalLinearAttention(backend="numpy", eps=1e-6))
    assert [(d.seq_id, d.chunk_index) for d in run.dead] == [("z", 0)]
    assert set(run.by_key()) == {("ok", 0)}
