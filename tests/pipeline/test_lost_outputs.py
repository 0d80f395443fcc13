"""Outputs lost after their commit are computed again: a published result file deleted or
damaged, or a pending one damaged between the commit and its publish.  The next `--resume`
continues the sequence from the commit where its lost outputs start (the commit chain keeps it;
a job's outputs of a sequence start where that job took it up), says so in one line, and the
union of the results holds every chunk once, bit-identical to an uninterrupted run.  When that
commit cannot be read, the line says exactly which chunks are lost and how to get them back.

Most cases run two jobs into one output folder, the first over chunks 0..7 and the second
(`--resume`) over all 12, so that the second's result file holds each sequence's newest commit
(chunks 8..11) alone, as a per-commit file did before files held whole output groups."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers.cli import linstream
from helpers.crash import embed_cmd, judge, reference_files, result_rows
from helpers.frozen import Frozen
from helpers.store_faults import flip_bit
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import write_chunk_file
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

SEQ = "seq-0000"
EVERY = ("--checkpoint-every", "4")
LOST = "the outputs of chunks 8..11 (commit 3,"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_path):
    """One input (2 sequences x 12 chunks), its chunks 0..7 alone, and the results of an
    uninterrupted run."""
    d = tmp_path_factory.mktemp("lost")
    chunks = sample_chunks(2, 12 * 16, 16, seed=9, shuffle=True, vocab_size=256)
    inp, head = str(d / "in.parquet"), str(d / "head.parquet")
    write_chunk_file(inp, chunks)
    write_chunk_file(head, [c for c in chunks if c.index < 8])
    ref = str(d / "reference")
    reference_files(
        embed_cmd(tiny_model_path, inp, ref, str(d / "ckpt-ref"), *EVERY), str(d / "ckpt-ref")
    )
    return inp, head, ref


def _two_jobs(model, inp, head, out, ckpt):
    """Chunks 0..7, then (--resume) all of them, into one output folder."""
    subprocess.run(embed_cmd(model, head, out, ckpt, *EVERY), check=True, capture_output=True)
    subprocess.run(
        embed_cmd(model, inp, out, ckpt, "--resume", *EVERY), check=True, capture_output=True
    )


def _newest_file(ckpt: str) -> str:
    """The published file that holds the newest outputs of SEQ (its output group's file)."""
    with open(CheckpointStore(ckpt).commits(SEQ)[0].manifest_path) as f:
        span = json.load(f)["history"]["outputs"]
    assert (span["first_chunk"], span["end_chunk"]) == (8, 12), span  # the second job's alone
    return span["file"].removesuffix(".parquet") + "-0000.parquet"


def _resume(model, inp, out, ckpt):
    return subprocess.run(
        embed_cmd(model, inp, out, ckpt, "--resume", *EVERY), capture_output=True, text=True
    )


def _said(stderr: str, *words: str) -> bool:
    return any(all(w in ln for w in words) for ln in stderr.splitlines())


@pytest.mark.parametrize("how", ["deleted", "damaged"])
@pytest.mark.parametrize("where", ["same-output", "new-output"])
def test_a_lost_published_file_is_computed_again(how, where, tmp_path, finished, tiny_model_path):
    inp, head, ref = finished
    ckpt, out1 = str(tmp_path / "ckpt"), str(tmp_path / "out1")
    _two_jobs(tiny_model_path, inp, head, out1, ckpt)
    lost = _newest_file(ckpt)
    if how == "deleted":
        os.remove(lost)
    else:
        flip_bit(lost, os.path.getsize(lost) // 2)
    out2 = out1 if where == "same-output" else str(tmp_path / "out2")
    done = _resume(tiny_model_path, inp, out2, ckpt)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _said(done.stderr, SEQ, LOST, "missing or damaged", "again"), done.stderr[-3000:]
    verdict = judge(ref, sorted({out1, out2}))
    assert verdict.ok, str(verdict)
    verify = linstream("checkpoint", "verify", ckpt)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # Nothing else is lost: once more, nothing to say.
    again = _resume(tiny_model_path, inp, str(tmp_path / "out3"), ckpt)
    assert again.returncode == 0 and "missing" not in again.stderr, again.stderr[-3000:]


def test_a_pending_file_damaged_before_its_publish_is_computed_again(
    tmp_path, finished, tiny_model_path
):
    """The second job stops itself after its commits, before publishing its output group; one
    sequence's newest pending file is damaged; the job is killed there.  The next --resume
    must not publish those bytes."""
    inp, head, ref = finished
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    subprocess.run(embed_cmd(tiny_model_path, head, out1, ckpt, *EVERY), check=True)
    flag = str(tmp_path / "frozen.json")
    job = Frozen(
        embed_cmd(tiny_model_path, inp, out1, ckpt, "--resume", *EVERY),
        flag,
        str(tmp_path / "job.log"),
        freeze=f"before-publish:1:{flag}",
    )
    info = job.wait_frozen()
    flip_bit(info["pending"], os.path.getsize(info["pending"]) // 2)
    job.kill()
    done = _resume(tiny_model_path, inp, out2, ckpt)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _said(done.stderr, info["seq_id"], "missing or damaged", "again"), done.stderr[-3000:]
    assert not os.path.exists(info["pending"])
    damaged = {k for k, _, _ in result_rows(out1) if k[0] == info["seq_id"] and k[1] >= 8}
    assert damaged == set(), "the damaged pending file's rows were published"
    verdict = judge(ref, [out1, out2])
    assert verdict.ok, str(verdict)


def test_lost_outputs_that_cannot_be_computed_again_are_named_with_the_way_back(
    tmp_path, finished, tiny_model_path
):
    """The commit before the lost outputs is damaged too: the line names the sequence, the
    chunks, the commit and the file, and says how to get them back; doing so gets them back."""
    inp, head, ref = finished
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    _two_jobs(tiny_model_path, inp, head, out1, ckpt)
    os.remove(_newest_file(ckpt))
    parent = CheckpointStore(ckpt).commits(SEQ)[1]
    assert parent.data_path is not None and parent.size is not None
    flip_bit(parent.data_path, parent.size // 2)
    done = _resume(tiny_model_path, inp, out2, ckpt)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _said(done.stderr, SEQ, LOST, "cannot be computed again", "--checkpoint-dir"), (
        done.stderr[-3000:]
    )
    verdict = judge(ref, [out1, out2])
    assert verdict.lost == [(SEQ, i) for i in range(8, 12)] and not verdict.duplicated, str(verdict)
    # The way back: the input again, into a new store and output; those chunks are there.
    fresh = str(tmp_path / "fresh")
    subprocess.run(
        embed_cmd(tiny_model_path, inp, fresh, str(tmp_path / "ckpt-new"), *EVERY), check=True
    )
    assert set(judge(ref, [fresh]).lost) == set()


def test_an_output_folder_removed_as_a_whole_is_not_a_forgery(tmp_path, finished, tiny_model_path):
    """The user removed the first job's whole output folder (its results kept elsewhere, say):
    the commits naming it are not refused; the newest commit's chunks of each sequence are
    computed again into the new output, and verify is clean."""
    import shutil

    inp, head, ref = finished
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    _two_jobs(tiny_model_path, inp, head, out1, ckpt)
    shutil.rmtree(out1)
    verify = linstream("checkpoint", "verify", ckpt)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    done = _resume(tiny_model_path, inp, out2, ckpt)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _said(done.stderr, SEQ, LOST, "again"), done.stderr[-3000:]
    newest = {(s, i) for s in (SEQ, "seq-0001") for i in range(8, 12)}
    verdict = judge(ref, [out2])
    assert set(verdict.lost) == set(judge(ref, []).lost) - newest, str(verdict)
    assert not (verdict.duplicated or verdict.mismatched or verdict.unexpected), str(verdict)


def test_a_jobs_only_result_file_lost_is_computed_again_from_the_first_chunk(
    tmp_path, finished, tiny_model_path
):
    """One job wrote every chunk of both sequences as one file (one output group); that file
    is deleted.  Each sequence's newest outputs start at its first chunk, so the next --resume
    computes the whole sequences again, and says so."""
    inp, _head, ref = finished
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    subprocess.run(embed_cmd(tiny_model_path, inp, out1, ckpt, *EVERY), check=True)
    files = [f for f in os.listdir(os.path.join(out1, "results")) if not f.startswith(".")]
    assert len(files) == 1, files
    os.remove(os.path.join(out1, "results", files[0]))
    done = _resume(tiny_model_path, inp, out2, ckpt)
    assert done.returncode == 0, done.stderr[-3000:]
    for seq in (SEQ, "seq-0001"):
        assert _said(done.stderr, seq, "the outputs of chunks 0..11 (commit 3,", "chunk 0"), (
            done.stderr[-3000:]
        )
    verdict = judge(ref, [out1, out2])
    assert verdict.ok, str(verdict)
