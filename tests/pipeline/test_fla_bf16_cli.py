"""`linstream embed --compute-dtype bfloat16` on a checkpoint folder, as a user runs it: a job
stopped and resumed in the other mode, and the refusal (the command's and the Python API's
`embed(..., compute_dtype="bfloat16")`) for a model that has no bfloat16 mode.

The bfloat16 products are forced to the rounding engine (LINSTREAM_BF16_PRODUCTS=mkl: the CPU's
bfloat16 instructions where it has them, MKL's widening where not; the same arithmetic), so the
two modes differ here whatever this machine's CPU (the widening engine gives the float32 mode's
bits; tests/ops/fla/test_fla_bf16.py).

A resumed job in the other mode: the carried state and its checkpoint format are the same in both
modes, so a bfloat16 job continues a float32 job's checkpoint and the reverse.  Tolerance: the
chunks after the switch are computed in the new mode from the old mode's state, so each differs
from an uninterrupted job in either mode by one part of the two modes' difference on those
chunks (the state's, or the new chunks' arithmetic); each must stay within 2 × d, d the largest
difference between the two uninterrupted jobs on those chunks (2: the parts may partly cancel
in d).  The chunks before the switch are the first mode's, bit for bit.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers.cli import linstream, one_error_line, write_texts
from helpers.fla_folders import TINY_CONFIGS, write_folder
from linstream.pipeline import Chunk, embed
from linstream.pipeline.io import write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs in subprocesses: `make check` leaves it out

SEED = 20261205
ROUNDING = {"LINSTREAM_BF16_PRODUCTS": "mkl"}
SEQS, CHUNKS, TOKENS, STOP = 3, 6, 24, 3  # the first job stops after STOP chunks of each


def _write_chunks(path, ids, upto):
    chunks = [
        Chunk(
            f"s{s}",
            i,
            ids[s, i * TOKENS : (i + 1) * TOKENS].astype(np.int32),
            final=i == CHUNKS - 1,
        )
        for s, i in itertools.product(range(SEQS), range(upto))
    ]
    write_chunk_file(str(path), chunks)
    return str(path)


def _rows(out):
    rows = {}
    for f in sorted((out / "results").rglob("*.parquet")):
        t = pq.read_table(f).to_pydict()
        for s, i, e in zip(t["seq_id"], t["chunk_index"], t["embedding"], strict=True):
            assert (s, int(i)) not in rows, (s, i)
            rows[s, int(i)] = np.asarray(e, np.float32)
    return rows


def _job(folder, inp, out, ckpt, mode, *extra):
    done = linstream(
        "embed", "--model", folder, "--input", inp, "--output", out, "--checkpoint-dir", ckpt,
        "--compute-dtype", mode, "--emit", "mean", "--checkpoint-every", "1",
        "--progress-every", "0", *extra, env=ROUNDING,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize(("first", "then"), [("float32", "bfloat16"), ("bfloat16", "float32")])
def test_a_job_resumed_in_the_other_mode_continues_its_checkpoint(tmp_path, first, then):
    print(f"seed {SEED}")
    folder = str(write_folder(tmp_path / "gla", TINY_CONFIGS["gla"], dtype="BF16", seed=4))
    ids = np.random.default_rng(SEED).integers(0, 50, (SEQS, CHUNKS * TOKENS))
    part = _write_chunks(tmp_path / "part.parquet", ids, STOP)
    full = _write_chunks(tmp_path / "full.parquet", ids, CHUNKS)
    refs = {}
    for mode in (first, then):
        out = tmp_path / f"ref-{mode}"
        _job(folder, full, out, tmp_path / f"ckpt-{mode}", mode)
        refs[mode] = _rows(out)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    _job(folder, part, out, ckpt, first)
    _job(folder, full, out, ckpt, then, "--resume")
    got = _rows(out)
    assert sorted(got) == sorted(refs[first])  # every chunk once
    after = [k for k in got if k[1] >= STOP]
    for k in got:
        if k[1] < STOP:
            assert np.array_equal(got[k], refs[first][k]), k
    d = max(float(np.max(np.abs(refs[first][k] - refs[then][k]))) for k in after)
    assert d > 0  # the two modes differ here
    worst = {m: max(float(np.max(np.abs(got[k] - refs[m][k]))) for k in after) for m in refs}
    print(f"{first} -> {then}: modes differ by {d:.3g}; resumed rows within {worst}")
    assert all(w <= 2 * d for w in worst.values()), (worst, d)
    # resumed in the other mode from the first mode's state: neither uninterrupted job's bits
    assert not any(np.array_equal(got[k], refs[then][k]) for k in after if k[1] == STOP)
    assert not any(np.array_equal(got[k], refs[first][k]) for k in after if k[1] == STOP)


def test_a_model_without_a_bfloat16_mode_is_refused_in_one_line(tmp_path):
    texts = write_texts(tmp_path / "texts", {"a.txt": "hello"})
    done = linstream(
        "embed", "--input", texts, "--output", tmp_path / "out", "--model", "builtin:default",
        "--compute-dtype", "bfloat16", "--progress-every", "0",
    )  # fmt: skip
    line = one_error_line(done)
    print(line)
    assert done.returncode == 2
    assert "the bfloat16 mode runs checkpoint folders in fla's format" in line
    assert "builtin:default computes in float32 or float64" in line
    with pytest.raises(ValueError, match="the bfloat16 mode runs checkpoint folders"):
        embed("hello", "builtin:default", compute_dtype="bfloat16")


def test_a_loaded_model_in_another_mode_is_refused_naming_both(tmp_path):
    """`embed(text, loaded_model, compute_dtype=...)`: a loaded model computes in the mode it was
    loaded in; asked for another, the call refuses naming both (it ran the model's own mode
    without a word before), and asked for its own, it runs."""
    from linstream.ops import load_model

    folder = write_folder(tmp_path / "gla", {**TINY_CONFIGS["gla"], "vocab_size": 256}, seed=3)
    ids = np.arange(1, 9, dtype=np.int32)
    BYTES = "builtin:bytes"  # the folder has no tokenizer.json; ids need none, the call names one
    model = load_model(str(folder))
    with pytest.raises(
        ValueError, match="compute_dtype bfloat16: the model given was loaded in float32"
    ):
        embed(ids, model, compute_dtype="bfloat16", tokenizer=BYTES)
    bf16 = load_model(str(folder), compute_dtype="bfloat16")
    with pytest.raises(
        ValueError, match="compute_dtype float32: the model given was loaded in bfloat16"
    ):
        embed(ids, bf16, compute_dtype=np.float32, tokenizer=BYTES)
    same = embed(ids, bf16, compute_dtype="bfloat16", tokenizer=BYTES)
    assert np.array_equal(same, embed(ids, bf16, tokenizer=BYTES))


def test_embed_and_resumable_give_the_command_lines_bfloat16_numbers(tmp_path, monkeypatch):
    """`embed(..., compute_dtype="bfloat16")` and `Resumable(..., compute_dtype="bfloat16")`
    give the rows `linstream embed --compute-dtype bfloat16` writes, bit for bit (the same
    step loads the model in the same mode), and those are not the float32 mode's."""
    from linstream.ops.model.fla.bf16 import choose_engine
    from linstream.ops.model.fla.f32 import choose_f32_products
    from linstream.pipeline import Resumable
    from linstream.pipeline.io.tokenizers import byte_tokenizer

    folder = tmp_path / "gla"
    write_folder(folder, {**TINY_CONFIGS["gla"], "vocab_size": 256}, dtype="BF16", seed=7)
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    write_texts(tmp_path / "in", {"a.txt": "state from chunk to chunk. " * 5, "b.txt": "é ü " * 9})
    order = [("seq_id", "ascending"), ("chunk_index", "ascending")]
    tables, notes = {}, {}
    for mode in ("float32", "bfloat16"):
        done = linstream(
            "embed", "--input", "in", "--output", f"out-{mode}", "--model", str(folder),
            "--backend", "numpy", "--chunk-tokens", "16", "--runner", "FnApiRunner",
            "--emit", "mean", "--compute-dtype", mode, cwd=tmp_path, env=ROUNDING,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        tables[mode] = pq.read_table(tmp_path / f"out-{mode}" / "results").sort_by(order)
        notes[mode] = [ln for ln in done.stderr.splitlines() if "compute dtype" in ln]
    # the job says how the products run, in one line as it starts
    note, f32 = choose_engine("mkl").note, choose_f32_products().note
    assert notes == {
        "float32": [f"linstream embed: compute dtype float32: {f32}"],
        "bfloat16": [f"linstream embed: compute dtype bfloat16: {note}"],
    }
    cli = tables["bfloat16"]
    assert cli.num_rows >= 2 and not cli.equals(tables["float32"])
    monkeypatch.setenv("LINSTREAM_BF16_PRODUCTS", "mkl")
    options = {"emit": "mean", "chunk_tokens": 16, "backend": "numpy"}
    got = embed(tmp_path / "in", str(folder), **options, compute_dtype="bfloat16", as_table=True)
    assert got.sort_by(order).equals(cli), (got.to_pydict(), cli.to_pydict())
    with Resumable(tmp_path / "ckpt", str(folder), **options, compute_dtype="bfloat16") as r:
        assert r.embed(tmp_path / "in", as_table=True).sort_by(order).equals(cli)
