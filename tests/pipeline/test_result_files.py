"""A finished job's result files grow with its results, not with its sequences times its
commits: every result file is one output group's (``part-<group>-0000.parquet``), a group is
published at the end of each bundle or once it holds ``group_bytes`` of results, and sequence
ids are a column (no per-sequence folder)."""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers.crash import commits_made, embed_cmd
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.elements import ChunkResult
from linstream.pipeline.io import read_results, write_chunk_file
from linstream.pipeline.stage.spans import SpanWriter

_GROUP_FILE = re.compile(r"part-[0-9a-f]{16}-0000\.parquet")


def _visible(results: str) -> list[str]:
    return sorted(n for n in os.listdir(results) if not n.startswith((".", "_")))


@pytest.mark.e2e  # the command in a subprocess
def test_a_job_of_many_sequences_and_commits_writes_one_file_per_group(tmp_path, tiny_model_path):
    """24 sequences x 6 chunks, a commit after every chunk (144 commits): one bundle in this
    runner, so one result file, holding every row, with the sequence id as a column."""
    chunks = sample_chunks(24, 6 * 16, 16, seed=5, shuffle=True, vocab_size=256)
    inp, out, ckpt = str(tmp_path / "in.parquet"), str(tmp_path / "out"), str(tmp_path / "ckpt")
    write_chunk_file(inp, chunks)
    cmd = embed_cmd(tiny_model_path, inp, out, ckpt, "--checkpoint-every", "1")
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert commits_made(ckpt) == 144
    names = _visible(os.path.join(out, "results"))
    print(f"result files: {names}")
    assert len(names) == 1 and _GROUP_FILE.fullmatch(names[0]), names
    table = pq.read_table(os.path.join(out, "results", names[0]))
    seqs, idxs = table.column("seq_id").to_pylist(), table.column("chunk_index").to_pylist()
    keys = set(zip(seqs, idxs, strict=True))
    assert keys == {(c.seq_id, c.index) for c in chunks} and table.num_rows == len(chunks)
    assert len(read_results(out)) == len(chunks)


def _commit(writer: SpanWriter, seq: str, commit: int) -> int:
    first = 2 * (commit - 1)
    results = [
        ChunkResult(seq, i, 4 * i, np.full(64, i, np.float32)) for i in range(first, first + 2)
    ]
    staged = writer.stage(seq, results, commit=commit, since=first, end=first + 2)
    assert staged is not None
    staged.writing.result()
    writer.committed(staged)
    return staged.rows.size


def test_a_group_is_published_once_it_holds_group_bytes(tmp_path):
    """Commits of 4 sequences x 3 commits, each pending file ~1-2 KiB, groups of 4 KiB: a file
    is published each time the open group reaches 4 KiB; the rest at the bundle's end."""
    out = str(tmp_path / "out")
    writer = SpanWriter(out, per_token=False, group_bytes=4096)
    sizes = [_commit(writer, f"s{s}", c) for c in (1, 2, 3) for s in range(4)]
    writer.flush()
    expected, held = 0, 0
    for size in sizes:
        held += size
        if held >= 4096:
            expected, held = expected + 1, 0
    expected += held > 0
    names = _visible(os.path.join(out, "results"))
    assert len(names) == expected and all(_GROUP_FILE.fullmatch(n) for n in names), names
    assert 1 < expected < len(sizes), sizes
    rows = [
        k
        for n in names
        for k in zip(
            pq.read_table(os.path.join(out, "results", n)).column("seq_id").to_pylist(),
            pq.read_table(os.path.join(out, "results", n)).column("chunk_index").to_pylist(),
            strict=True,
        )
    ]
    assert sorted(rows) == sorted((f"s{s}", i) for s in range(4) for i in range(6))
    assert [n for n in os.listdir(os.path.join(out, "results")) if n.startswith(".pending")] == []
