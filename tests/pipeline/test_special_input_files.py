"""A FIFO among the input files of `linstream embed` is never opened (opening it would wait for a
writer forever): it becomes one `unreadable_file` dead letter naming it, and the job goes on."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers.cli import linstream
from linstream.pipeline import Chunk
from linstream.pipeline.io import read_dead_letters, read_results, write_chunk_file

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo"),
]

#: A job over a few tiny files takes seconds; a reader blocked on the FIFO never ends.
TIMEOUT_S = 300


def _text_input(src, rng):
    texts = {"b.txt": "".join(rng.choice(list("abcdef \n"), size=40)), "c/d.txt": "hello"}
    for rel, text in texts.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text, encoding="utf-8")
    return "a-pipe.txt", {k: -(-len(v.encode()) // 16) for k, v in texts.items()}


def _jsonl_input(src, rng):
    rows = [{"id": "r1", "text": "x" * 20}, {"id": "r2", "text": "yz"}]
    (src / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return "a-pipe.jsonl", {r["id"]: -(-len(r["text"]) // 16) for r in rows}


def _chunk_input(src, rng):
    chunks = [
        Chunk("g", i, rng.integers(0, 256, 8).astype(np.int32), final=i == 2) for i in range(3)
    ]
    write_chunk_file(str(src / "good.parquet"), chunks)
    return "a-pipe.parquet", {"g": 3}


@pytest.mark.parametrize(
    "make_input", [_text_input, _jsonl_input, _chunk_input], ids=["text", "jsonl", "chunks"]
)
def test_a_fifo_among_the_inputs_is_one_dead_letter_and_the_job_goes_on(
    tmp_path, tiny_model_path, make_input
):
    rng = np.random.default_rng(5)
    print("seed 5")
    src = tmp_path / "in"
    src.mkdir()
    fifo_name, expected_chunks = make_input(src, rng)
    fifo = src / fifo_name  # sorts first: format detection looks at the first file
    os.mkfifo(fifo)
    proc = linstream(
        "embed",
        "--input",
        "in",
        "--output",
        "out",
        "--model",
        tiny_model_path,
        "--backend",
        "numpy",
        "--chunk-tokens",
        "16",
        "--progress-every",
        "0",
        cwd=tmp_path,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "dead letters: 1 (unreadable_file 1)" in proc.stdout, proc.stdout
    results = read_results(str(tmp_path / "out"))
    got: dict[str, list[int]] = {}
    for seq_id, index in sorted(results):
        got.setdefault(seq_id, []).append(index)
    assert got == {s: list(range(n)) for s, n in expected_chunks.items()}, sorted(results)
    dead = read_dead_letters(str(tmp_path / "out"))
    assert [d["reason"] for d in dead] == ["unreadable_file"], dead
    message = dead[0]["message"]
    assert str(fifo) in message or f"in/{fifo_name}" in message, message
    assert "expected a regular file, found a FIFO (named pipe)" in message, message
