"""Dead letters exactly once in an output folder that jobs stop in and resume into: a job that
reaches its end leaves one record per (sequence, chunk, reason) there, none lost and none
doubled, however many earlier jobs met (and wrote) the same bad input."""

from __future__ import annotations

import collections
import os
import signal
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.crash import Stop, embed_cmd, judge, reference_files, run_until
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import read_dead_letters, write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

EVERY = ("--checkpoint-every", "4")


def _inputs(folder, *, extra: bool = False, make: bool = True) -> str:
    """Good chunks of 3 sequences, a file of rows of which one is poison, and a junk file;
    ``extra``: and one more sequence (``make=False``: that alone, added to the folder)."""
    folder.mkdir(exist_ok=True)
    chunks = sample_chunks(4, 24 * 16, 16, seed=3, vocab_size=256)
    good = [c for c in chunks if c.seq_id != "seq-0003"]
    if extra:
        write_chunk_file(str(folder / "more.parquet"), [c for c in chunks if c not in good])
    if not make:
        return str(folder / "*.parquet")
    write_chunk_file(str(folder / "good.parquet"), good)
    tokens = pa.list_(pa.int32())
    rows = pa.table(
        {
            "seq_id": ["p", "p", "p"],
            "chunk_index": [0, 1, 2],
            "final": [False, False, True],
            "tokens": pa.array([[1, 2, 3], [1, None, 3], [4, 5, 6]], tokens),
        }
    )
    pq.write_table(rows, str(folder / "poison-rows.parquet"))
    (folder / "junk.parquet").write_bytes(b"this is not parquet at all\n" * 10)
    (folder / "junk-2.parquet").write_bytes(b"nor is this\n" * 10)  # two records without a seq
    return str(folder / "*.parquet")


def _keys(out: str, *folders: str) -> collections.Counter:
    """Each dead letter as (sequence, chunk, reason), and its message for those that name no
    sequence (two unreadable files are two dead letters), the input ``folders`` in it as one."""

    def message(d: dict) -> str:
        if d["seq_id"]:
            return ""
        m = d["message"]
        for folder in folders:
            m = m.replace(folder, "<input>")
        return m

    return collections.Counter(
        (d["seq_id"], d["chunk_index"], d["reason"], message(d)) for d in read_dead_letters(out)
    )


def test_stops_and_resumes_into_one_output_record_each_dead_letter_once(tmp_path, tiny_model_path):
    seed = 23
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    inp, ref_inp = _inputs(tmp_path / "in"), _inputs(tmp_path / "in-ref", extra=True)
    folders = (str(tmp_path / "in-ref"), str(tmp_path / "in"))
    ref = str(tmp_path / "reference")
    commits = reference_files(
        embed_cmd(tiny_model_path, ref_inp, ref, str(tmp_path / "ckpt-ref"), *EVERY),
        str(tmp_path / "ckpt-ref"),
    )
    expected = _keys(ref, *folders)
    assert expected and max(expected.values()) == 1, expected
    assert {r for _s, _c, r, _m in expected} >= {"bad_dtype", "unreadable_file"}, expected
    assert sum(r == "unreadable_file" for _s, _c, r, _m in expected) == 2, expected
    out, ckpt, log = str(tmp_path / "out"), str(tmp_path / "ckpt"), str(tmp_path / "jobs.log")
    stops = []
    for k in range(2):  # stopped in the middle of their commits
        cmd = embed_cmd(tiny_model_path, inp, out, ckpt, *(("--resume",) if k else ()), *EVERY)
        after = int(rng.integers(1, max(2, commits // 2)))
        stop = run_until(cmd, ckpt, Stop(int(signal.SIGKILL), after, 0.0), log)
        stops.append(stop.returncode)
    # Two that reach their end, each meeting every bad row again (the second with one more
    # sequence to embed, so that it has work to do).
    for last in (False, True):
        if last:
            _inputs(tmp_path / "in", extra=True, make=False)
        done = subprocess.run(
            embed_cmd(tiny_model_path, inp, out, ckpt, "--resume", *EVERY),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        got = _keys(out, *folders)
        assert got == expected, (stops, got, expected)
    verdict = judge(ref, [out])
    assert verdict.ok, str(verdict)
    names = os.listdir(os.path.join(out, "dead_letters"))
    print(f"stops {stops}; dead-letter files {names}")


def test_bad_chunk_indexes_of_one_sequence_stay_one_dead_letter_each(tmp_path, tiny_model_path):
    """Three different bad rows of one sequence (chunk index 0.0, 1.5, NaN as float64) are
    three dead letters in the folder, as the job's counter says: settling the folder keeps a
    dead letter without a whole chunk index apart by its message (which names the index)."""
    rows = pa.table(
        {
            "seq_id": ["x", "x", "x"],
            "chunk_index": pa.array([0.0, 1.5, float("nan")], pa.float64()),
            "tokens": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32())),
        }
    )
    (tmp_path / "in").mkdir()
    pq.write_table(rows, str(tmp_path / "in" / "bad.parquet"))
    proc = subprocess.run(
        embed_cmd(
            tiny_model_path, str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
        ),
        capture_output=True,
        text=True,
    )
    assert "dead letters: 3 (bad_index 3)" in proc.stdout, (proc.stdout, proc.stderr)
    dead = read_dead_letters(str(tmp_path / "out"))
    assert len(dead) == 3, dead
    assert {d["reason"] for d in dead} == {"bad_index"}
    assert len({d["message"] for d in dead}) == 3, dead
