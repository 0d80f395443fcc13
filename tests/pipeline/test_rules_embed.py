"""A model whose layers use the decaying and delta rules, run by `linstream embed` the way the
additive model is: shuffled and duplicated chunks, stopped jobs resumed from their checkpoints
(every chunk written once, bit-identical to an uninterrupted run, equal to a plain loop over
`embed_chunk`), and a resume under a model with another rule refused."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line
from helpers.crash import crash_and_resume, embed_cmd, reference_files, result_rows
from linstream.ops import load_model
from linstream.ops.model.config import ModelConfig
from linstream.ops.model.weights import init_weights, write_model
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import read_dead_letters, read_results, write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _rule_model(path, rules, seed=0):
    config = ModelConfig(
        vocab_size=256, d_model=16, n_layers=len(rules), n_heads=2, d_head=8, d_ff=32, rules=rules
    )
    write_model(str(path), config, init_weights(config, seed))
    return str(path)


RULES = [{"rule": "gated_delta"}, {"rule": "decay", "gamma": [0.9, 0.99]}]


def _loop_means(model_path, chunks):
    """Per chunk, the mean embedding of a plain in-order loop over `embed_chunk`."""
    model = load_model(model_path)
    by_seq: dict[str, dict[int, np.ndarray]] = {}
    for c in chunks:
        by_seq.setdefault(c.seq_id, {})[c.index] = np.asarray(c.data)
    out = {}
    for seq_id, parts in by_seq.items():
        states = model.initial_states()
        for i in sorted(parts):
            emb, states = model.embed_chunk(parts[i], states)
            out[(seq_id, i)] = emb
    return out


@pytest.mark.parametrize("seed", [31])
def test_a_rule_model_stopped_and_resumed_writes_every_chunk_once(seed, tmp_path):
    print(f"rule-model crash seed {seed}")
    model = _rule_model(tmp_path / "rules.safetensors", RULES)
    chunks = sample_chunks(3, 40 * 32, 32, seed=seed, shuffle=True, duplicates=4, vocab_size=256)
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, chunks)
    extra = ("--checkpoint-every", "4")
    ref = str(tmp_path / "reference")
    ckpt = str(tmp_path / "ckpt-ref")
    files = reference_files(embed_cmd(model, inp, ref, ckpt, *extra), ckpt)
    # The uninterrupted run equals the plain loop (same float32 kernels, same chunks).
    expected = _loop_means(model, chunks)
    got = read_results(ref)
    assert sorted(got) == sorted(expected)
    for key, emb in expected.items():
        start, mean = got[key]
        assert start == key[1] * 32
        tol = 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(emb).max()))
        np.testing.assert_allclose(mean, emb.mean(axis=0), rtol=0, atol=tol, err_msg=str(key))
    assert len(result_rows(ref)) == len(expected)
    verdict, stops = crash_and_resume(
        seed, model, inp, str(tmp_path), ref, kills=2, files=files, extra=extra
    )
    print(f"stops {[(s.signal, s.after_files, s.returncode) for s in stops]}: {verdict}")
    assert verdict.ok, str(verdict)


def test_a_resume_under_a_model_with_another_rule_is_refused(tmp_path):
    first_model = _rule_model(tmp_path / "a.safetensors", RULES)
    other = [{"rule": "gated_delta"}, {"rule": "decay", "gamma": [0.9, 0.999]}]
    second_model = _rule_model(tmp_path / "b.safetensors", other)
    chunks = sample_chunks(1, 256, 32, seed=5, vocab_size=256)
    write_chunk_file(str(tmp_path / "a.parquet"), [c for c in chunks if c.index < 4])
    write_chunk_file(str(tmp_path / "b.parquet"), [c for c in chunks if c.index >= 4])
    common = ["--backend", "numpy", "--checkpoint-dir", "ckpt", "--checkpoint-every", "2"]
    first = linstream(
        "embed", "--model", first_model, "--input", "a.parquet", "--output", "o1", *common,
        cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    second = linstream(
        "embed", "--model", second_model, "--input", "b.parquet", "--output", "o2", *common,
        "--resume", cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == 3, (second.stdout, second.stderr)
    assert "went to the dead letters as restore_failed" in one_error_line(second)
    letters = read_dead_letters(str(tmp_path / "o2"))
    assert {d["reason"] for d in letters} == {"restore_failed"}
    assert sorted(d["chunk_index"] for d in letters) == [4, 5, 6, 7]
    assert all("state of another model" in d["message"] for d in letters)
    assert read_results(str(tmp_path / "o2")) == {}
    # The refused checkpoint is left as it was.
    assert sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file()) == before
