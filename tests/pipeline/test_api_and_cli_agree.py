"""The Python API and the command line are one engine: the same folder through `linstream embed`
(a subprocess on Beam's FnApiRunner), `embed()` and `Resumable` gives the same result rows, bit
for bit, and the same dead-letter records, for a dirty folder (good files beside a gzipped one,
a binary one and an empty one) and for a checkpoint folder in fla's format."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.cli import linstream, write_texts
from helpers.fla_folders import TINY_CONFIGS, write_folder
from linstream.pipeline import Resumable, embed
from linstream.pipeline.io import read_dead_letters

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

GOOD = {
    "a.txt": "linear attention carries its state from chunk to chunk. " * 5,
    "notes/b.md": "é and ü, in UTF-8, " * 6,
}
_ORDER = [("seq_id", "ascending"), ("chunk_index", "ascending")]


def _dirty_folder(root: Path) -> Path:
    write_texts(root, GOOD)
    (root / "packed.txt.gz").write_bytes(gzip.compress(b"a gzipped text file, read unpacked. " * 4))
    (root / "tool.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))  # NUL bytes
    (root / "empty.txt").write_bytes(b"")
    return root


def _cli(tmp_path: Path, model: str, *args: str) -> tuple[pa.Table, list[dict]]:
    out = tmp_path / "out"
    done = linstream(
        "embed", "--input", "in", "--output", str(out), "--model", model,
        "--backend", "numpy", "--chunk-tokens", "16", "--runner", "FnApiRunner", *args,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return pq.read_table(out / "results").sort_by(_ORDER), _records(read_dead_letters(str(out)))


def _records(dead: list) -> list[dict]:
    rows = [d if isinstance(d, dict) else d.as_dict() for d in dead]
    return sorted(rows, key=lambda d: (d["seq_id"], d["reason"], d["message"]))


def test_a_dirty_folder_gives_the_command_lines_results_and_dead_letters(
    tmp_path, tiny_model_path, monkeypatch
):
    _dirty_folder(tmp_path / "in")
    cli, cli_dead = _cli(tmp_path, tiny_model_path, "--emit", "mean")
    # a compressed file is its text, named without the suffix (packed.txt.gz is packed.txt)
    assert sorted(set(cli.column("seq_id").to_pylist())) == ["a.txt", "notes/b.md", "packed.txt"]
    assert [(d["seq_id"], d["reason"]) for d in cli_dead] == [
        ("empty.txt", "empty_sequence"),
        ("tool.bin", "not_text"),
    ]
    monkeypatch.chdir(tmp_path)  # the dead letters name the files as the command was given them
    options = {"emit": "mean", "chunk_tokens": 16, "backend": "numpy"}
    table, dead = embed(
        Path("in"), tiny_model_path, **options, as_table=True, return_dead_letters=True
    )
    assert table.sort_by(_ORDER).equals(cli), (table.to_pydict(), cli.to_pydict())
    assert _records(dead) == cli_dead
    with Resumable("ckpt", tiny_model_path, **options, checkpoint_every=2) as resumable:
        table, dead = resumable.embed(Path("in"), as_table=True, return_dead_letters=True)
        assert table.sort_by(_ORDER).equals(cli)
        assert _records(dead) == cli_dead
        again, dead_again = resumable.embed(Path("in"), as_table=True, return_dead_letters=True)
    assert again.num_rows == 0 and _records(dead_again) == cli_dead  # all committed: skipped


@pytest.fixture(scope="module")
def byte_folder(tmp_path_factory):
    """A GLA checkpoint folder whose tokenizer.json is a byte-level one (ids are UTF-8 bytes)."""
    from linstream.pipeline.io.tokenizers import byte_tokenizer

    folder = tmp_path_factory.mktemp("fla") / "gla"
    write_folder(folder, {**TINY_CONFIGS["gla"], "vocab_size": 256}, seed=7)
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    return str(folder)


@pytest.mark.parametrize("emit", ["mean", "sequence"])
def test_an_fla_folder_gives_the_command_lines_numbers(tmp_path, byte_folder, emit):
    write_texts(tmp_path / "in", GOOD)
    cli, cli_dead = _cli(tmp_path, byte_folder, "--emit", emit)
    assert cli_dead == [] and cli.num_rows >= len(GOOD)
    options = {"emit": emit, "chunk_tokens": 16, "backend": "numpy"}
    table = embed(tmp_path / "in", byte_folder, **options, as_table=True)
    assert table.sort_by(_ORDER).equals(cli), (table.to_pydict(), cli.to_pydict())
    with Resumable(tmp_path / "ckpt", byte_folder, **options) as resumable:
        assert resumable.embed(tmp_path / "in", as_table=True).sort_by(_ORDER).equals(cli)
        if emit == "sequence":  # the array form: one row per file, in the folder's order
            vectors = resumable.embed(tmp_path / "in")  # finished: from its checkpoint
            ids, rows = cli.column("seq_id").to_pylist(), cli.column("embedding").to_pylist()
            want = {s: np.asarray(v, np.float32) for s, v in zip(ids, rows, strict=True)}
            assert vectors.dtype == np.float32
            np.testing.assert_array_equal(vectors, np.stack([want[s] for s in sorted(GOOD)]))


def test_a_file_beside_its_gzipped_twin_is_refused_by_both(tmp_path, tiny_model_path, monkeypatch):
    """`a.txt` and `a.txt.gz` would be one sequence (a compressed file's id leaves out its
    suffix): the command line refuses the folder in one line (exit 2, nothing written), and
    `embed()` raises the same refusal, naming both files."""
    write_texts(tmp_path / "in", {"a.txt": "a plain text file"})
    (tmp_path / "in" / "a.txt.gz").write_bytes(gzip.compress(b"another text, gzipped"))
    done = linstream(
        "embed", "--input", "in", "--output", "out", "--model", tiny_model_path, cwd=tmp_path
    )
    want = "in/a.txt and in/a.txt.gz would both be sequence 'a.txt'"
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and want in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=want):
        embed(Path("in"), tiny_model_path, backend="numpy")
