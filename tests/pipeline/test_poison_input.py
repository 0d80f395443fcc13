"""Poison rows and poison files cost only themselves: one bad row dead-letters that row, a row
without a usable seq_id is a `bad_seq_id` dead letter (never a sequence named "None" or "b'...'"),
an unreadable file is one `unreadable_file` dead letter naming it, and the job goes on."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from linstream.pipeline import Chunk
from linstream.pipeline.elements import ChunkCoder, Rejected, Unencodable
from linstream.pipeline.io import read_dead_letters, read_results, table_to_chunks, write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

TOKENS = pa.list_(pa.int32())


def test_one_null_token_costs_only_its_row():
    table = pa.table(
        {
            "seq_id": ["a", "a", "b"],
            "chunk_index": [0, 1, 0],
            "final": [False, True, True],
            "tokens": pa.array([[1, 2], [3, None, 5], [6]], TOKENS),
        }
    )
    a0, a1, b0 = table_to_chunks(table)
    np.testing.assert_array_equal(a0.data, [1, 2])
    np.testing.assert_array_equal(b0.data, [6])
    assert isinstance(a1.data, Unencodable) and "position(s) [1]" in a1.data.description


def test_one_null_feature_value_costs_only_its_row():
    feats = pa.list_(pa.list_(pa.float32(), 2))
    table = pa.table(
        {
            "seq_id": ["a", "b", "c"],
            "chunk_index": [0, 0, 0],
            "final": [True, True, True],
            "features": pa.array([[[1, 2]], [[3, None]], [None, [4, 5]]], feats),
        }
    )
    a, b, c = table_to_chunks(table)
    np.testing.assert_array_equal(a.data, [[1, 2]])
    assert isinstance(b.data, Unencodable) and isinstance(c.data, Unencodable)


def test_rows_without_a_usable_seq_id_are_rejected_not_keyed():
    toks = pa.array([[1], [2], [3], [4]], TOKENS)
    table = pa.table(
        {"seq_id": [None, "None", "", "ok"], "chunk_index": [0, 1, 2, 3], "tokens": toks}
    )
    chunks = list(table_to_chunks(table, source="f.parquet"))
    assert [c.seq_id for c in chunks] == ["", "None", "", "ok"]
    for c in (chunks[0], chunks[2]):
        assert isinstance(c.data, Rejected) and c.data.reason == "bad_seq_id"
        assert "f.parquet" in c.data.description
    binary = pa.table(
        {"seq_id": pa.array([b"x"], pa.binary()), "chunk_index": [5], "tokens": toks[:1]}
    )
    (c,) = table_to_chunks(binary)
    assert c.seq_id == "" and c.index == 5 and c.data.reason == "bad_seq_id"
    assert "b'x'" in c.data.description
    (m,) = table_to_chunks(pa.table({"chunk_index": [0], "tokens": toks[:1]}))
    assert m.data.reason == "bad_seq_id" and "no seq_id column" in m.data.description
    coder = ChunkCoder()
    assert coder.decode(coder.encode(c)) == c  # the reason survives a shuffle


def _good_chunks(seq: str, n: int, size: int, rng) -> list[Chunk]:
    return [
        Chunk(seq, i, rng.integers(0, 256, size).astype(np.int32), final=i == n - 1)
        for i in range(n)
    ]


def test_embed_job_dead_letters_poison_rows_and_files_and_keeps_the_rest(tmp_path, tiny_model_path):
    rng = np.random.default_rng(11)
    print("seed=11")
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    write_chunk_file(str(src / "good.parquet"), _good_chunks("g", 3, 8, rng))
    # Rows of sequence "p" with one poison row (a null token id), plus rows without a usable id.
    p = _good_chunks("p", 3, 8, rng)
    rows = pa.table(
        {
            "seq_id": ["p", "p", "p", None, None],
            "chunk_index": [0, 1, 2, 0, 7],
            "final": [False, False, True, False, True],
            "tokens": pa.array(
                [p[0].data.tolist(), [1, None, 3], p[2].data.tolist(), [4], [5]], TOKENS
            ),
        }
    )
    pq.write_table(rows, str(src / "poison-rows.parquet"))
    pq.write_table(
        pa.table(
            {
                "seq_id": pa.array([b"bin"], pa.binary()),
                "chunk_index": [0],
                "final": [True],
                "tokens": pa.array([[1, 2]], TOKENS),
            }
        ),
        str(src / "binary-ids.parquet"),
    )
    (src / "junk.parquet").write_bytes(b"this is not parquet at all\n" * 10)
    whole = (src / "good.parquet").read_bytes()
    (src / "truncated.parquet").write_bytes(whole[: len(whole) // 2])
    pq.write_table(pa.table({"text": ["no chunk columns"]}), str(src / "other-schema.parquet"))

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "linstream.pipeline.app.cli",
            "embed",
            "--input",
            str(src / "*.parquet"),
            "--output",
            str(out),
            "--model",
            tiny_model_path,
            "--backend",
            "numpy",
            "--emit",
            "mean",
            "--progress-every",
            "0",
            "--runner=FnApiRunner",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    results = read_results(str(out))
    assert set(results) == {("g", 0), ("g", 1), ("g", 2), ("p", 0)}, sorted(results)
    dead = read_dead_letters(str(out))
    got = sorted(((d["seq_id"], d["chunk_index"], d["reason"]) for d in dead), key=repr)
    assert got == sorted(
        [
            ("p", 1, "bad_dtype"),  # the poison row alone...
            ("p", 2, "gap"),  # ...and what waited behind it at the end of input
            ("", 0, "bad_seq_id"),
            ("", 7, "bad_seq_id"),
            ("", 0, "bad_seq_id"),  # the binary id
            ("", None, "unreadable_file"),
            ("", None, "unreadable_file"),
            ("", None, "unreadable_file"),
        ],
        key=repr,
    ), dead
    unreadable = sorted(d["message"] for d in dead if d["reason"] == "unreadable_file")
    for name, words in (
        ("junk.parquet", "cannot be read as a Parquet chunk file"),
        ("other-schema.parquet", "expected a chunk file with columns"),
        ("truncated.parquet", "cannot be read as a Parquet chunk file"),
    ):
        path = os.path.join(str(src), name)
        assert any(m.startswith(f"file {path}: {words}") for m in unreadable), (name, unreadable)
    bad_ids = [d["message"] for d in dead if d["reason"] == "bad_seq_id"]
    assert sum("b'bin'" in m for m in bad_ids) == 1 and sum("None" in m for m in bad_ids) == 2
