"""Chunk files, the `linstream` command (sample, embed, demo, checkpoint) on small data."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from linstream.pipeline import Chunk
from linstream.pipeline.app.cli import main
from linstream.pipeline.elements import Unencodable
from linstream.pipeline.io import (
    chunk_schema,
    chunks_to_table,
    read_dead_letters,
    read_results,
    table_to_chunks,
)


def test_chunk_table_round_trip_tokens_and_features():
    toks = [
        Chunk("a", 1, np.arange(3, dtype=np.int32)),
        Chunk("b", 0, np.arange(2, dtype=np.int32), True),
    ]
    back = list(table_to_chunks(chunks_to_table(toks)))
    assert back == toks
    rng = np.random.default_rng(0)
    feats = [Chunk("f", 0, rng.standard_normal((4, 3)).astype(np.float32), True)]
    table = chunks_to_table(feats, input_dim=3)
    assert table.schema == chunk_schema(3)
    assert list(table_to_chunks(table)) == feats


def test_malformed_rows_become_chunks_the_stage_rejects():
    table = pa.table(
        {
            "seq_id": ["a", "b"],
            "chunk_index": [0, 1],
            "final": [False, True],
            "tokens": pa.array([[1, None], None], pa.list_(pa.int32())),
        }
    )
    a, b = table_to_chunks(table)
    assert isinstance(a.data, Unencodable) and isinstance(b.data, Unencodable)


def test_sample_embed_and_checkpoint_commands(tmp_path, tiny_model_path, capsys):
    src, out, ckpt = tmp_path / "src", tmp_path / "out", tmp_path / "ckpt"
    assert (
        main(
            [
                "sample",
                "--output",
                str(src),
                "--sequences",
                "2",
                "--tokens",
                "300",
                "--chunk-tokens",
                "64",
                "--shuffle",
                "--duplicates",
                "2",
                "--model",
                tiny_model_path,
            ]
        )
        == 0
    )
    files = sorted(src.glob("*.parquet"))
    assert pq.read_schema(files[0]) == chunk_schema()
    assert (
        main(
            [
                "embed",
                "--input",
                str(src / "*.parquet"),
                "--output",
                str(out),
                "--model",
                tiny_model_path,
                "--checkpoint-dir",
                str(ckpt),
                "--emit",
                "mean",
                "--backend",
                "numpy",
                "--direct_num_workers=1",
            ]
        )
        == 0
    )
    res = read_results(str(out))
    assert len(res) == 2 * 5 and all(v[1].shape == (16,) for v in res.values())
    assert read_dead_letters(str(out)) == []
    assert "duplicates 2" in capsys.readouterr().out
    assert main(["checkpoint", "verify", str(ckpt)]) == 0
    assert main(["checkpoint", "inspect", str(ckpt)]) == 0


def test_demo_passes_on_small_data(tmp_path, tiny_model_path, capsys):
    rc = main(
        [
            "demo",
            "--workdir",
            str(tmp_path),
            "--sequences",
            "2",
            "--tokens",
            "1024",
            "--chunk-tokens",
            "128",
            "--model",
            tiny_model_path,
            "--backend",
            "numpy",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "resume check passed" in text
