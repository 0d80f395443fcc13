"""A second `linstream embed` on the same folders, as a user runs it: the installed command in a
subprocess, asserting on its exit status, its printed lines and the files it leaves.

The rules (pipeline/app/second_run.py): an output folder that holds results is refused unless
`--resume`, `--output-mode append` or `--output-mode overwrite`; one results folder never mixes
two schemas or two models; a checkpoint folder that holds sequences needs `--resume`; a changed
input under a checkpoint is named as such; the summary counts the result rows written.
"""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers.cli import linstream, one_error_line, write_texts
from helpers.models import write_tiny_model
from linstream.pipeline.io import read_dead_letters, read_results

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

TEXTS = {"a.txt": "first document " * 20, "notes/b.txt": "second one, shorter " * 5}
RECORD = "_linstream_output.json"


@pytest.fixture
def folder(tmp_path):
    write_texts(tmp_path / "in", TEXTS)
    return tmp_path


def _embed(cwd, model, *args):
    common = ["embed", "--input", "in", "--model", model, "--backend", "numpy"]
    return linstream(*common, "--chunk-tokens", "64", *args, cwd=cwd)


def _chunks() -> int:
    return sum(-(-len(t.encode()) // 64) for t in TEXTS.values())


def _files(out) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in (out / "results").rglob("*.parquet"))


def test_a_second_run_into_a_folder_with_results_is_refused_unless_asked(folder, tiny_model_path):
    n = _chunks()
    first = _embed(folder, tiny_model_path, "--output", "out")
    assert first.returncode == 0, first.stderr
    assert f"linstream embed: {n} result row(s) written to out/results/" in first.stdout
    record = json.loads((folder / "out" / RECORD).read_text())
    assert (record["emit"], record["width"], record["model"]) == ("mean", 16, tiny_model_path)
    (folder / "out" / "my-notes.txt").write_text("mine")  # not linstream's: never touched
    files = _files(folder / "out")

    again = _embed(folder, tiny_model_path, "--output", "out")
    assert again.returncode == 2
    assert one_error_line(again) == (
        "linstream embed: error: --output out already holds the results of an earlier job "
        "(1 result file(s)); use another --output, --output-mode append to add this job's rows "
        "to them, --output-mode overwrite to replace them"
    )
    assert _files(folder / "out") == files

    append = _embed(folder, tiny_model_path, "--output", "out", "--output-mode", "append")
    assert append.returncode == 0, append.stderr
    assert f"linstream embed: {n} result row(s) written to out/results/" in append.stdout
    assert len(pd.read_parquet(folder / "out" / "results")) == 2 * n

    over = _embed(folder, tiny_model_path, "--output", "out", "--output-mode", "overwrite")
    assert over.returncode == 0, over.stderr
    assert f"linstream embed: {n} result row(s) written to out/results/" in over.stdout
    frame = pd.read_parquet(folder / "out" / "results")
    assert len(frame) == n and frame.groupby(["seq_id", "chunk_index"]).size().max() == 1
    assert (folder / "out" / "my-notes.txt").read_text() == "mine"


def test_one_results_folder_never_mixes_two_schemas_or_two_models(folder, tiny_model_path):
    first = _embed(folder, tiny_model_path, "--output", "out")
    assert first.returncode == 0, first.stderr
    before = pq.read_table(folder / "out" / "results")
    append = ["--output", "out", "--output-mode", "append"]
    tokens = _embed(folder, tiny_model_path, *append, "--emit", "tokens")
    assert tokens.returncode == 2
    line = one_error_line(tokens)
    assert (
        f"--output out holds results written with --emit mean, 16 wide (model {tiny_model_path}); "
        f"this job writes --emit tokens, 16 wide (model {tiny_model_path}): one results folder "
        "holds one schema"
    ) in line, line
    # Same columns, other meaning: the last token's vector beside chunk means is refused too.
    last = _embed(folder, tiny_model_path, *append, "--emit", "last")
    assert last.returncode == 2 and "this job writes --emit last" in one_error_line(last)
    other = write_tiny_model(str(folder / "other.safetensors"), seed=11)
    model = _embed(folder, other, *append)
    assert model.returncode == 2
    line = one_error_line(model)
    assert f"--output out holds embeddings of model {tiny_model_path} (fingerprint" in line
    assert "embeddings of two models do not mix in one folder" in line
    after = pq.read_table(folder / "out" / "results")
    assert after.schema == before.schema and after.num_rows == before.num_rows
    # A folder written before records existed: its files' own schema is checked.
    (folder / "out" / RECORD).unlink()
    legacy = _embed(folder, tiny_model_path, *append, "--emit", "tokens")
    assert legacy.returncode == 2
    assert "holds results written with --emit mean, last or sequence, 16 wide" in (
        one_error_line(legacy)
    )
    tok = _embed(
        folder, tiny_model_path, "--output", "out", "--output-mode=overwrite", "--emit=tokens"
    )
    assert tok.returncode == 0, tok.stderr
    frame = pd.read_parquet(folder / "out" / "results")
    assert list(frame.columns) == ["seq_id", "chunk_index", "start_position", "embeddings"]
    assert frame["embeddings"].notna().all()


def test_a_checkpoint_folder_that_holds_sequences_needs_resume(folder, tiny_model_path):
    n = _chunks()
    ckpt = ["--checkpoint-dir", "ckpt"]
    first = _embed(folder, tiny_model_path, "--output", "o1", *ckpt)
    assert first.returncode == 0, first.stderr
    again = _embed(folder, tiny_model_path, "--output", "o2", *ckpt)
    assert again.returncode == 2
    assert one_error_line(again) == (
        "linstream embed: error: --checkpoint-dir ckpt already holds checkpoints of 2 "
        "sequence(s) (e.g. 'a.txt'); add --resume to continue them (the chunks they hold are "
        "skipped), or use an empty --checkpoint-dir"
    )
    assert not (folder / "o2" / "results").exists()
    resumed = _embed(folder, tiny_model_path, "--output", "o2", *ckpt, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"duplicates {n}" in resumed.stdout
    assert "linstream embed: 0 result row(s) written to o2/results/" in resumed.stdout
    # --resume continues into the folder it wrote (the rows it holds stay; new ones are added).
    into_same = _embed(folder, tiny_model_path, "--output", "o1", *ckpt, "--resume")
    assert into_same.returncode == 0, into_same.stderr
    assert len(read_results(str(folder / "o1"))) == n
    refused = _embed(folder, tiny_model_path, "--output", "o1", *ckpt, "--resume", "--emit", "last")
    assert refused.returncode == 2 and "one results folder holds one schema" in (
        one_error_line(refused)
    )
    wipe = _embed(
        folder, tiny_model_path, "--output", "o1", *ckpt, "--resume", "--output-mode", "overwrite"
    )
    assert wipe.returncode == 2
    assert "--output-mode overwrite with --resume would delete the results" in one_error_line(wipe)
    assert len(read_results(str(folder / "o1"))) == n


def test_a_resume_into_the_same_output_completes_it(tmp_path, tiny_model_path):
    """A job over part of the input, then --resume over all of it into the same folder: every
    chunk once, and the second job counts only the rows it added."""
    write_texts(tmp_path / "in", {"a.txt": "x" * 200})
    common = ["--model", tiny_model_path, "--backend", "numpy", "--chunk-tokens", "64"]
    common += ["--checkpoint-dir", "ckpt", "--output", "out"]
    first = linstream("embed", "--input", "in", *common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "4 result row(s) written" in first.stdout
    write_texts(tmp_path / "in2", {"a.txt": "x" * 200, "c.txt": "y" * 100})
    shutil.copy(tmp_path / "in" / "a.txt", tmp_path / "in2" / "a.txt")
    second = linstream("embed", "--input", "in2", *common, "--resume", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "2 chunks" in second.stdout and "duplicates 4" in second.stdout
    assert "linstream embed: 2 result row(s) written to out/results/" in second.stdout
    assert sorted(read_results(str(tmp_path / "out"))) == [("a.txt", i) for i in range(4)] + [
        ("c.txt", 0),
        ("c.txt", 1),
    ]


def test_a_changed_input_under_a_checkpoint_is_named_not_fenced(folder, tiny_model_path):
    ckpt = ["--checkpoint-dir", "ckpt"]
    first = _embed(folder, tiny_model_path, "--output", "o1", *ckpt)
    assert first.returncode == 0, first.stderr
    text = TEXTS["a.txt"]
    (folder / "in" / "a.txt").write_text(text[:70] + "X" + text[71:])  # one byte of chunk 1
    again = _embed(folder, tiny_model_path, "--output", "o2", *ckpt, "--resume")
    assert again.returncode == 0, again.stderr
    assert "dead letters: 1 (conflicting_duplicate 1) in o2/dead_letters/" in again.stdout
    assert "fenced" not in again.stdout + again.stderr
    (dead,) = read_dead_letters(str(folder / "o2"))
    assert (dead["seq_id"], dead["chunk_index"], dead["reason"]) == (
        "a.txt",
        1,
        "conflicting_duplicate",
    )
    assert (
        "the input for sequence 'a.txt' changed since its checkpoint (chunk 1 differs"
        in (dead["message"])
    )


def test_append_with_another_chunk_size_is_refused(folder, tiny_model_path):
    """Two chunkings in one folder would give one (seq_id, chunk_index) two spans of text: the
    folder's record holds the job's --chunk-tokens, and another one is refused like another
    --emit or model (same size: appended)."""
    first = _embed(folder, tiny_model_path, "--output", "out")  # --chunk-tokens 64
    assert first.returncode == 0, first.stderr
    assert json.loads((folder / "out" / RECORD).read_text())["chunk_tokens"] == 64
    before = pq.read_table(folder / "out" / "results")
    append = ["--output", "out", "--output-mode", "append"]
    other = _embed(folder, tiny_model_path, *append, "--chunk-tokens", "32")
    assert other.returncode == 2
    line = one_error_line(other)
    assert (
        "--output out holds chunks of 64 tokens (--chunk-tokens 64); this job cuts chunks of 32"
        in (line)
    )
    after = pq.read_table(folder / "out" / "results")
    assert after.num_rows == before.num_rows
    same = _embed(folder, tiny_model_path, *append)
    assert same.returncode == 0, same.stderr
    frame = pd.read_parquet(folder / "out" / "results")
    assert len(frame) == 2 * before.num_rows
    assert frame.groupby(["seq_id", "chunk_index"])["start_position"].nunique().max() == 1
