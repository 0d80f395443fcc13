"""A sequence's state as data, where the user meets it: `linstream state export`, `embed(...,
initial_state=)`, `linstream checkpoint fork|rewind`, and the refusals of bad state files.

The inputs are token-id arrays cut into chunks of 8 tokens, and every cut (export position,
fork, rewind) is at a chunk boundary, so the chunks after it are the same in both runs: the
outputs must be equal bit for bit (same code, same inputs, same state).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line
from helpers.fla_folders import TINY_CONFIGS, write_folder
from linstream.pipeline.app.embed_api import Resumable, embed
from linstream.state.exchange import StateFileError

CHUNK = 8
SEED = 11
TOK = "builtin:bytes"  # the token ids are given; the folders carry no tokenizer.json


@pytest.fixture(
    scope="module",
    params=[
        "builtin-tiny",
        pytest.param("retnet", marks=pytest.mark.slow),  # ~20 s each: its kernels compile
        pytest.param("gla", marks=pytest.mark.slow),
    ],
)
def model(request, tmp_path_factory):
    """The tiny built-in model (S and z), fla's RetNet (its decay and rotation depend on the
    position) and GLA (S and convolution tails: named tensors)."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "builtin-tiny":
        from helpers.models import write_tiny_model

        return write_tiny_model(str(folder / "tiny.safetensors"))
    config = {**TINY_CONFIGS[request.param], "vocab_size": 256}
    return str(write_folder(folder / "m", config, seed=5))


def _tokens(n, seed):
    print(f"token seed {seed}")
    return np.random.default_rng(seed).integers(0, 256, n).astype(np.int32)


def _rows(table, seq_id):
    return [r for r in table.to_pylist() if r["seq_id"] == seq_id]


def _same(got, want):
    """Rows equal bit for bit: chunk index, start position and every embedding value."""
    assert [(r["chunk_index"], r["start_position"]) for r in got] == [
        (r["chunk_index"], r["start_position"]) for r in want
    ]
    for a, b in zip(got, want, strict=True):
        x, y = np.asarray(a["embeddings"], np.float32), np.asarray(b["embeddings"], np.float32)
        assert x.tobytes() == y.tobytes(), (a["chunk_index"], np.abs(x - y).max())


def _store_with_a(tmp_path, model, toks):
    ckpt = str(tmp_path / "ckpt")
    job = Resumable(
        ckpt,
        model,
        emit="tokens",
        chunk_tokens=CHUNK,
        tokenizer=TOK,
        checkpoint_every=1,
        keep_every_tokens=16,
    )
    whole = job.embed({"a": toks}, as_table=True)
    return ckpt, _rows(whole, "a")


def test_export_at_a_position_then_import_continues_bit_for_bit(tmp_path, model):
    toks = _tokens(48, SEED)
    ckpt, whole = _store_with_a(tmp_path, model, toks)
    listed = linstream("state", "export", ckpt, "--json")
    assert listed.returncode == 0, listed.stderr
    (rec,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert rec["seq_id"] == "a" and rec["positions"] == [16, 32, 40, 48]
    out = tmp_path / "at16.safetensors"
    missed = linstream("state", "export", ckpt, "--seq", "a", "--position", "24", "--out", out)
    assert missed.returncode == 1 and not out.exists()
    assert one_error_line(missed) == (
        "linstream state export: sequence 'a': expected a retained position, received 24; the "
        "store keeps positions 16, 32, 40, 48 (keep more with --keep-every-tokens)"
    )
    done = linstream("state", "export", ckpt, "--seq", "a", "--position", "16", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "position 16" in done.stdout and out.stat().st_size > 0

    rest = toks[16:]
    got = embed(
        {"b": rest, "c": rest},
        model,
        emit="tokens",
        chunk_tokens=CHUNK,
        tokenizer=TOK,
        initial_state={"b": out},
        as_table=True,
    )
    # b continues a at position 16: a's chunks 2.. (positions go on from 16)
    expect = [{**r, "chunk_index": r["chunk_index"] - 2} for r in whole[2:]]
    _same(_rows(got, "b"), expect)
    # c has no file: it starts from the zero state, and differs
    fresh = _rows(got, "c")
    assert fresh[0]["start_position"] == 0
    assert not np.array_equal(fresh[0]["embeddings"], _rows(got, "b")[0]["embeddings"])
    # one file for every sequence
    every = embed(
        {"d": rest}, model, emit="tokens", chunk_tokens=CHUNK, tokenizer=TOK, initial_state=out
    )
    _same(_rows(every, "d"), [{**r, "seq_id": "d"} for r in expect])


def test_a_fork_equals_the_prefix_and_the_new_text_in_one_run(tmp_path, model):
    toks, new = _tokens(48, SEED), _tokens(20, SEED + 1)
    ckpt, _ = _store_with_a(tmp_path, model, toks)
    forked = linstream("checkpoint", "fork", ckpt, "--seq", "a", "--as", "f", "--position", "16")
    assert forked.returncode == 0, forked.stderr
    again = linstream("checkpoint", "fork", ckpt, "--seq", "a", "--as", "f", "--position", "32")
    assert again.returncode == 1 and "--force" in one_error_line(again)
    inp = np.concatenate([toks[:16], new])
    job = Resumable(ckpt, model, emit="tokens", chunk_tokens=CHUNK, tokenizer=TOK)
    got = job.embed({"f": inp}, as_table=True)  # f's two first chunks are in its commit
    one_run = embed(
        {"f": inp}, model, emit="tokens", chunk_tokens=CHUNK, tokenizer=TOK, as_table=True
    )
    _same(_rows(got, "f"), _rows(one_run, "f")[2:])
    # A fork is checked like a resume: another prefix than the one its commit covers is named
    other = linstream("checkpoint", "fork", ckpt, "--seq", "a", "--as", "g", "--position", "16")
    assert other.returncode == 0, other.stderr
    changed = np.concatenate([new[:16], new])
    _, dead = job.embed({"g": changed}, as_table=True, return_dead_letters=True)
    assert {(d.seq_id, d.chunk_index, d.reason) for d in dead} == {
        ("g", 0, "conflicting_duplicate"),
        ("g", 1, "conflicting_duplicate"),
    }


def test_a_rewound_sequence_equals_a_fresh_run_to_the_position_and_the_new_chunks(tmp_path, model):
    toks, new = _tokens(48, SEED), _tokens(20, SEED + 2)
    ckpt, _ = _store_with_a(tmp_path, model, toks)
    proc = linstream("checkpoint", "rewind", ckpt, "--seq", "a", "--position", "32")
    assert proc.returncode == 0, proc.stderr
    inp = np.concatenate([toks[:32], new])
    job = Resumable(ckpt, model, emit="tokens", chunk_tokens=CHUNK, tokenizer=TOK)
    got, dead = job.embed({"a": inp}, as_table=True, return_dead_letters=True)
    assert dead == []  # a's first four chunks are its commit's: checked and skipped
    fresh = embed(
        {"a": inp}, model, emit="tokens", chunk_tokens=CHUNK, tokenizer=TOK, as_table=True
    )
    _same(_rows(got, "a"), _rows(fresh, "a")[4:])


def test_bad_state_files_are_one_line_on_the_command_line_and_the_same_in_python(
    tmp_path, tiny_model_path
):
    from helpers.models import write_tiny_model

    other = write_tiny_model(str(tmp_path / "other.safetensors"), seed=1)
    foreign = tmp_path / "foreign.safetensors"
    ckpt = str(tmp_path / "c")
    Resumable(ckpt, other, emit="mean", chunk_tokens=CHUNK).embed({"p": _tokens(16, 3)})
    assert linstream("state", "export", ckpt, "--seq", "p", "--out", foreign).returncode == 0
    text = tmp_path / "notes.safetensors"  # other refusals: tests/state/test_exchange.py
    text.write_text("not a state\n")
    (tmp_path / "in.txt").write_text("some text to embed")
    for bad in (foreign, text):
        with pytest.raises(StateFileError) as info:
            embed(["x"], tiny_model_path, emit="mean", initial_state=bad)
        proc = linstream(
            "embed",
            "--input",
            tmp_path / "in.txt",
            "--output",
            tmp_path / "out",
            "--model",
            tiny_model_path,
            "--emit",
            "mean",
            "--initial-state",
            bad,
        )
        assert proc.returncode == 2
        assert one_error_line(proc) == f"linstream embed: error: {info.value}"
        assert str(info.value).startswith(f"state file {bad}: expected")
        if bad == foreign:
            assert "another model or architecture" in str(info.value)


def test_a_sequence_with_a_commit_resumes_from_it_and_the_file_is_said_unused_once(
    tmp_path, tiny_model_path, caplog
):
    toks = _tokens(48, SEED)
    ckpt, whole = _store_with_a(tmp_path, tiny_model_path, toks)
    out = tmp_path / "at16.safetensors"
    assert (
        linstream(
            "state", "export", ckpt, "--seq", "a", "--position", "16", "--out", out
        ).returncode
        == 0
    )
    job = Resumable(
        ckpt, tiny_model_path, emit="tokens", chunk_tokens=CHUNK, tokenizer=TOK, initial_state=out
    )
    with caplog.at_level("WARNING"):
        got, dead = job.embed({"a": toks, "n": toks[16:]}, as_table=True, return_dead_letters=True)
    assert dead == [] and _rows(got, "a") == []  # a's commit holds every chunk: all skipped
    expect = [{**r, "seq_id": "n", "chunk_index": r["chunk_index"] - 2} for r in whole[2:]]
    _same(_rows(got, "n"), expect)  # n has no commit: it starts from the file
    said = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert said == [
        f"sequence 'a' resumes from its commit at position 48; its --initial-state {out} is "
        "not used (nor for any other sequence that has a commit)"
    ]


def test_emit_sequence_with_an_initial_state_is_refused_in_python_and_on_the_command_line(
    tmp_path, tiny_model_path
):
    toks = _tokens(48, SEED)
    ckpt, _ = _store_with_a(tmp_path, tiny_model_path, toks)
    out = tmp_path / "s.safetensors"
    assert linstream("state", "export", ckpt, "--seq", "a", "--out", out).returncode == 0
    with pytest.raises(ValueError, match="emit 'sequence'") as info:
        embed(["x"], tiny_model_path, initial_state=out)  # emit="sequence" is embed()'s default
    (tmp_path / "in.txt").write_text("text")
    proc = linstream(
        "embed", "--input", tmp_path / "in.txt", "--output", tmp_path / "o",
        "--model", tiny_model_path, "--emit", "sequence", "--initial-state", out,
    )  # fmt: skip
    assert proc.returncode == 2
    assert one_error_line(proc) == f"linstream embed: error: --initial-state: {info.value}"
