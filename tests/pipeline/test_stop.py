"""SIGINT and SIGTERM stop `linstream embed` cleanly: one line, the resume command, 130/143.

Each case starts a real job in a subprocess, waits for its first checkpoint commit, sends the
signal and asserts on what the user sees and on what is left on disk: no traceback, no worker
process, no temporary folder in the output, the results of every chunk the checkpoints cover
readable (as many rows as the line says), and a resume command that runs as printed and adds
the rest, each chunk once.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
from helpers.cli import linstream, start

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _alive_with_tag(tag: str) -> list[int]:
    """Processes whose environment carries `tag` (the job and every worker it started)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if f"LINSTREAM_TEST_TAG={tag}".encode() in env:
            found.append(int(name))
    return found


@pytest.fixture(scope="module")
def long_input(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("stop-input")
    proc = linstream(
        "sample",
        "--output",
        root,
        "--sequences",
        "4",
        "--tokens",
        "40000",
        "--chunk-tokens",
        "64",
        "--model",
        tiny_model_path,
    )
    assert proc.returncode == 0, proc.stderr
    return root


def _wait_for_commit(ckpt: Path, proc, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ckpt.exists() and any(p.is_file() for p in ckpt.rglob("*")):
            return
        if proc.poll() is not None:
            pytest.fail(f"the job ended before it was stopped: {proc.communicate()}")
        time.sleep(0.1)
    pytest.fail("no checkpoint commit appeared")


@pytest.mark.parametrize(
    ("signum", "workers", "run_resume"),
    [
        (signal.SIGINT, [], True),
        (
            signal.SIGTERM,
            ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
            False,
        ),
        (
            signal.SIGINT,
            ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
            False,
        ),
    ],
    ids=["sigint", "sigterm-multiprocess", "sigint-multiprocess"],
)
def test_a_signal_stops_the_job_with_one_line_and_the_resume_command(
    tmp_path, long_input, tiny_model_path, signum, workers, run_resume
):
    tag = uuid.uuid4().hex
    argv = [
        "embed",
        "--input",
        str(long_input),
        "--output",
        "out",
        "--checkpoint-dir",
        "ckpt",
        "--model",
        tiny_model_path,
        "--backend",
        "numpy",
        "--checkpoint-every",
        "2",
        "--progress-every",
        "0",
        *workers,
    ]
    proc = start(*argv, cwd=tmp_path, env={"LINSTREAM_TEST_TAG": tag})
    _wait_for_commit(tmp_path / "ckpt", proc)
    time.sleep(1.0)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, (out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    name = signal.Signals(signum).name
    expected = shlex.join(["linstream", *argv, "--resume"])
    assert lines[0].startswith(f"linstream embed: stopped by {name}: "), lines[0]
    assert lines[0].endswith(f"resume with: {expected}"), lines[0]
    time.sleep(0.5)
    assert _alive_with_tag(tag) == [], "a worker process outlived the stopped job"
    leftovers = [p for p in (tmp_path / "out").rglob("*") if p.name.startswith((".temp", "beam-"))]
    assert leftovers == []
    # What the commits cover is readable now, as many rows as the line says: per sequence, its
    # chunks 0 .. next_chunk - 1 of its newest commit, each once.
    said = re.search(
        r": ([\d,]+) result row\(s\) readable under out/results \(every chunk", lines[0]
    )
    assert said, lines[0]
    inspect = linstream("checkpoint", "inspect", "ckpt", "--json", cwd=tmp_path)
    committed = {r["seq_id"]: r["next_chunk"] for r in map(json.loads, inspect.stdout.splitlines())}
    rows = pd.read_parquet(tmp_path / "out" / "results")
    assert int(said.group(1).replace(",", "")) == len(rows) == sum(committed.values()) > 0
    held = rows.groupby("seq_id")["chunk_index"].agg(["count", "nunique", "max"])
    for seq_id, next_chunk in committed.items():
        assert tuple(held.loc[seq_id]) == (next_chunk, next_chunk, next_chunk - 1), seq_id
    resume = shlex.split(lines[0].split("resume with: ", 1)[1])
    assert resume[0] == "linstream"
    if not run_resume:  # the printed command runs once (in the first case): it takes a while
        return
    done = linstream(*resume[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    total = 4 * -(-40000 // 64)  # the input: 4 sequences of 40,000 tokens, 64 a chunk
    assert f"{total - len(rows):,} result row(s) written to out/results/" in done.stdout
    after = pd.read_parquet(tmp_path / "out" / "results")
    assert len(after) == total and not after.duplicated(["seq_id", "chunk_index"]).any()


def test_without_a_checkpoint_dir_the_line_says_nothing_can_be_resumed(
    tmp_path, long_input, tiny_model_path
):
    proc = start(
        "embed",
        "--input",
        str(long_input),
        "--output",
        "out",
        "--model",
        tiny_model_path,
        "--backend",
        "numpy",
        "--progress-every",
        "0.2",
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the first progress line: chunks are being applied
    assert first.startswith("linstream: "), first
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (out, err)
    stop = [ln for ln in err.splitlines() if ln.startswith("linstream embed: stopped")]
    assert len(stop) == 1 and "Traceback" not in err, err
    assert stop[0].endswith(
        "nothing can be resumed without --checkpoint-dir (run it again to start over)"
    )
