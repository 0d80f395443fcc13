"""A writer frozen in the middle of its commit protocol (SIGSTOP, as a swapped-out or paused
process) while another job works on the same store, then let go (SIGCONT), never costs the other
job a file: it removes only what it owns, and nobody removes its files by their age.

The freeze is exact: the job runs through `helpers.fault_cli`, which stops the process itself at
the chosen step (see tests/helpers/fault_cli.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.cli import linstream
from helpers.crash import embed_cmd, judge, reference_files
from helpers.frozen import Frozen, fault_env, with_faults
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

CHUNKS = 16  # one sequence of 16 chunks: commits at chunks 4, 8, 12 and the final one at 16


@pytest.fixture(scope="module")
def one_sequence(tmp_path_factory, tiny_model_path):
    """The input (all chunks, and its first 4 chunks alone) and an uninterrupted run's results."""
    d = tmp_path_factory.mktemp("frozen")
    chunks = sample_chunks(1, CHUNKS * 16, 16, seed=17, shuffle=True, vocab_size=256)
    inp, head = str(d / "in.parquet"), str(d / "head.parquet")
    write_chunk_file(inp, chunks)
    write_chunk_file(head, [c for c in chunks if c.index < 4])
    ref = str(d / "reference")
    extra = ("--checkpoint-every", "4")
    reference_files(
        embed_cmd(tiny_model_path, inp, ref, str(d / "ckpt-ref"), *extra), str(d / "ckpt-ref")
    )
    return inp, head, ref


def _verify_clean(ckpt: str) -> None:
    verify = linstream("checkpoint", "verify", ckpt)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "orphan" not in verify.stdout, verify.stdout


def test_a_late_fenced_writer_never_removes_the_winners_data_file(
    tmp_path, one_sequence, tiny_model_path
):
    """Job A (every 4) freezes just before its final commit; job B (--resume, every 1) runs to
    the end, so its newest commit holds the very state A is about to commit; A goes on, finds
    its commit number taken and is fenced.  The store stays whole, and one more --resume exits
    0 with every chunk once in the union of the results."""
    inp, _head, ref = one_sequence
    ckpt = str(tmp_path / "ckpt")
    out_a, out_b, out_c = (str(tmp_path / n) for n in ("out-a", "out-b", "out-c"))
    a = Frozen(
        embed_cmd(tiny_model_path, inp, out_a, ckpt, "--checkpoint-every", "4"),
        str(tmp_path / "frozen.json"),
        str(tmp_path / "a.log"),
        freeze=f"before-commit:3:{tmp_path / 'frozen.json'}",
    )
    info = a.wait_frozen()
    assert info["commit"] == 4, info  # the final commit (chunks 12..15)
    b = subprocess.run(
        embed_cmd(tiny_model_path, inp, out_b, ckpt, "--resume", "--checkpoint-every", "1"),
        capture_output=True,
        text=True,
    )
    assert b.returncode == 0, b.stderr[-3000:]
    rc_a = a.resume()
    log_a = (tmp_path / "a.log").read_text()
    assert rc_a == 0 and "Traceback" not in log_a, log_a[-3000:]
    assert "fenced 4" in log_a, log_a[-3000:]  # its chunks 12..15: B committed them first
    _verify_clean(ckpt)
    c = subprocess.run(
        embed_cmd(tiny_model_path, inp, out_c, ckpt, "--resume", "--checkpoint-every", "4"),
        capture_output=True,
        text=True,
    )
    assert c.returncode == 0, c.stderr[-3000:]
    verdict = judge(ref, [out_a, out_b, out_c])
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("how", ["aged-file", "skewed-clock"])
def test_a_slow_writers_pending_output_is_never_removed_by_its_age(
    how, tmp_path, one_sequence, tiny_model_path
):
    """Job A freezes between making its output span durable (a hidden pending file) and
    creating the commit that names it.  Meanwhile the pending file is an hour old (aged by
    hand, or seen by a job whose clock runs an hour ahead), and job B, writing into the same
    output folder, restores the sequence (its input holds only chunks A already committed).  A
    goes on and commits the span: its file must still be there, so that every chunk is in the
    results once."""
    inp, head, ref = one_sequence
    ckpt = str(tmp_path / "ckpt")
    out_a, out_c = str(tmp_path / "out-a"), str(tmp_path / "out-c")
    out_b = out_a
    flag = str(tmp_path / "frozen.json")
    a = Frozen(
        embed_cmd(tiny_model_path, inp, out_a, ckpt, "--checkpoint-every", "4"),
        flag,
        str(tmp_path / "a.log"),
        freeze=f"before-commit:1:{flag}",
    )
    info = a.wait_frozen()
    assert info["commit"] == 2 and os.path.exists(info["pending"]), info
    faults = {}
    if how == "aged-file":
        os.utime(info["pending"], (os.path.getmtime(info["pending"]) - 3600,) * 2)
    else:
        faults["clock_skew_s"] = "3600"
    b = subprocess.run(
        with_faults(embed_cmd(tiny_model_path, head, out_b, ckpt, "--resume")),
        capture_output=True,
        text=True,
        env=fault_env(**faults),
    )
    assert b.returncode == 0, b.stderr[-3000:]
    assert "restores 1" in b.stdout, b.stdout  # B did restore the frozen writer's sequence
    assert os.path.exists(info["pending"]), "B removed A's pending output"
    rc_a = a.resume()
    assert rc_a == 0, (tmp_path / "a.log").read_text()[-3000:]
    _verify_clean(ckpt)
    c = subprocess.run(
        embed_cmd(tiny_model_path, inp, out_c, ckpt, "--resume"), capture_output=True, text=True
    )
    assert c.returncode == 0, c.stderr[-3000:]
    verdict = judge(ref, [out_a, out_c])
    assert verdict.ok, str(verdict)
