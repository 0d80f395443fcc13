"""A crafted commit manifest cannot make a job touch a file outside the checkpoint store and the
output folders of that store's jobs.

The manifest's `check` is an unkeyed SHA-256 that anyone can recompute, so an edited manifest is
self-consistent.  Each case edits the newest manifest of one sequence as a reviewer did (its
output span pointed at a file elsewhere, `check` recomputed), then runs `linstream embed
--resume` (with and without `--restore-fallback`) and `linstream checkpoint verify`: the file
elsewhere keeps its bytes, no file appears there, the job and verify name the refused manifest
and why, and every chunk is still in the results (the forged commit's own chunks may be there
twice: the store lied about where they were written).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest
from helpers.cli import linstream
from helpers.crash import embed_cmd, judge, reference_files
from helpers.store_faults import flip_bit, reseal_manifest
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import read_dead_letters, write_chunk_file
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

SEQ = "seq-0000"
EVERY = ("--checkpoint-every", "4")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_path):
    """One input (2 sequences x 12 chunks) and the results of an uninterrupted run."""
    d = tmp_path_factory.mktemp("crafted")
    chunks = sample_chunks(2, 12 * 16, 16, seed=5, shuffle=True, vocab_size=256)
    inp = str(d / "in.parquet")
    write_chunk_file(inp, chunks)
    ref = str(d / "reference")
    reference_files(
        embed_cmd(tiny_model_path, inp, ref, str(d / "ckpt-ref"), *EVERY), str(d / "ckpt-ref")
    )
    return inp, ref


def _forge(manifest_path: str, edit) -> None:
    with open(manifest_path) as f:
        fields = json.load(f)
    edit(fields["history"]["outputs"])
    with open(manifest_path, "w") as f:
        json.dump(reseal_manifest(fields), f)


def _snapshot(folder: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.join(dirpath, name)] = f.read()
    return out


CASES = ["file-elsewhere+fallback", "pending-elsewhere", "results-lookalike-elsewhere"]


@pytest.mark.parametrize("case", CASES)
def test_a_forged_output_span_never_reaches_outside(case, tmp_path, finished, tiny_model_path):
    inp, ref = finished
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "precious.txt"
    victim.write_bytes(b"the user's own file, nothing to do with linstream\n" * 40)
    subprocess.run(embed_cmd(tiny_model_path, inp, out1, ckpt, *EVERY), check=True)

    newest = CheckpointStore(ckpt).commits(SEQ)[0]
    assert newest.data_path is not None
    known = victim.read_bytes()
    if case == "file-elsewhere+fallback":
        # The reviewer's first case: the span names the file, the commit's data is damaged, and
        # the fallback rolls the commit back (which removes the outputs it names).
        def edit(o):
            o["file"] = str(victim)

        flip_bit(newest.data_path, newest.size // 2)
        extra = ("--restore-fallback",)
    elif case == "pending-elsewhere":
        # The second: the data is intact and the "pending" output is a file whose bytes are
        # known, so a roll-forward would move it into place (deleting it where it was).
        def edit(o):
            o["pending"] = str(victim)
            o["file"] = str(outside / "moved-here.parquet")
            o["size"], o["sha256"] = len(known), hashlib.sha256(known).hexdigest()

        extra = ()
    else:
        # Names in the exact form linstream writes, under a folder no job of this store wrote.
        lookalike = outside / "results" / os.path.basename(os.path.dirname(newest.manifest_path))
        lookalike.mkdir(parents=True)
        target = lookalike / "000000000008-000000000012.parquet"
        target.write_bytes(known)

        def edit(o):
            o["file"] = str(target)
            o["pending"] = str(lookalike / f".pending-{target.name[:-8]}-0123456789ab.parquet")

        flip_bit(newest.data_path, newest.size // 2)
        extra = ("--restore-fallback",)
    _forge(newest.manifest_path, edit)
    before = _snapshot(str(outside))

    verify = linstream("checkpoint", "verify", ckpt)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    bad = [ln for ln in verify.stdout.splitlines() if ln.startswith("BAD ")]
    assert any(newest.manifest_path in ln and "outside" in ln and "output" in ln for ln in bad), (
        verify.stdout
    )
    assert "Traceback" not in verify.stdout + verify.stderr

    job = subprocess.run(
        embed_cmd(tiny_model_path, inp, out2, ckpt, "--resume", *extra),
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in job.stderr, job.stderr[-3000:]
    assert _snapshot(str(outside)) == before, "the job wrote or deleted outside its folders"
    if extra:
        # The forged commit is skipped like a damaged one; the job says which and why.
        assert job.returncode == 0, job.stderr[-3000:]
        assert any(
            newest.manifest_path in ln and "outside" in ln for ln in job.stderr.splitlines()
        ), job.stderr[-3000:]
        verdict = judge(ref, [out1, out2])
        assert not (verdict.lost or verdict.mismatched or verdict.unexpected), str(verdict)
        # Its chunks were recomputed; the copy its real (unnamed) file holds stays beside them.
        assert set(verdict.duplicated) <= {(SEQ, i) for i in range(8, 12)}, str(verdict)
    else:
        # Without a fallback the sequence is refused, named, and the job exits 3.
        assert job.returncode == 3, job.stderr[-3000:]
        dead = [d for d in read_dead_letters(out2) if d["reason"] == "restore_failed"]
        assert dead and {d["seq_id"] for d in dead} == {SEQ}
        assert all("outside" in d["message"] for d in dead), dead[0]["message"]


def test_an_output_folder_of_an_earlier_version_is_marked_by_one_resume_into_it(
    tmp_path, finished, tiny_model_path
):
    """Results written before output folders were marked: a job with another --output refuses
    the commits naming them and says how to mark the folder; one --resume into that folder
    marks it, and from then on any --output works."""
    inp, ref = finished
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    subprocess.run(embed_cmd(tiny_model_path, inp, out1, ckpt, *EVERY), check=True)
    results = os.path.join(out1, "results")
    for name in os.listdir(results):
        if name.startswith(".linstream-store-"):
            os.remove(os.path.join(results, name))  # as an earlier version left it
    verify = linstream("checkpoint", "verify", ckpt)
    assert verify.returncode == 1 and f"--output {out1}" in verify.stdout, verify.stdout
    refused = subprocess.run(
        embed_cmd(tiny_model_path, inp, out2, ckpt, "--resume", *EVERY),
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 3, refused.stderr[-3000:]
    marking = subprocess.run(
        embed_cmd(tiny_model_path, inp, out1, ckpt, "--resume", *EVERY),
        capture_output=True,
        text=True,
    )
    assert marking.returncode == 0, marking.stderr[-3000:]
    assert linstream("checkpoint", "verify", ckpt).returncode == 0
    again = subprocess.run(
        embed_cmd(tiny_model_path, inp, out2, ckpt, "--resume", *EVERY),
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    verdict = judge(ref, [out1, out2])
    assert verdict.ok, str(verdict)
