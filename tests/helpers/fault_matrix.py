"""The fault matrix: one small input embedded through each kind of fault on each kind of store,
judged the way a user judges it.

A cell is (where, fault).  Where: a local folder, or a prefix on an object store (S3 through a
moto server, GCS through fake-gcs-server), holding the checkpoint store and every job's output
folder.  Faults (each a function below, run by `run_cell`):

``plain-stop``        a job stopped (SIGKILL or SIGINT) at a point of its commit protocol (before
                      a commit, or between a commit and its publish), then resumed;
``twin-job``          two `--resume` jobs at once, then one more;
``frozen-writer``     a job frozen (SIGSTOP) before a commit while another runs to the end with
                      commits after every chunk, then let go (SIGCONT);
``skewed-clock``      a job frozen between making its pending output durable and its commit,
                      while a job whose clock runs an hour ahead restores its sequences into
                      the same output folder, then let go;
``crafted-manifest``  the newest manifest of a sequence edited to name a file outside (its
                      check recomputed) and its data damaged, then `--resume --restore-fallback`;
``damaged-file``      a published result (the file holding one sequence's newest outputs)
                      deleted or damaged, and another sequence's newest data file damaged:
                      `--resume` (that sequence refused, exit 3), then with
                      `--restore-fallback`.

After each cell: the union of every job's results holds every chunk exactly once, bit-identical
to an uninterrupted run (a crafted manifest may leave its own chunks twice: it lied about where
they were written), and `linstream checkpoint verify` names exactly the files the fault damaged
(nothing else), with no orphan where writers removed their own files.  A file outside keeps its
bytes.  The random choices (stop point, signal) come from the cell's printed seed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .frozen import Frozen, fault_env, with_faults
from .models import write_tiny_model
from .outputs import judge
from .store_faults import reseal_manifest

__all__ = ["FAULTS", "Cell", "Expect", "Inputs", "make_inputs", "run_cell"]

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.app.cli"]
FAULTS = (
    "plain-stop",
    "twin-job",
    "frozen-writer",
    "skewed-clock",
    "crafted-manifest",
    "damaged-file",
)
EVERY = 4
SEQ0, SEQ1 = "seq-0000", "seq-0001"


@dataclass
class Inputs:
    """Local files every cell reads: the model, the input, its first chunks alone (``head``:
    chunks below `EVERY` of each sequence) and the results of one uninterrupted run."""

    model: str
    full: str
    head: str
    reference: str
    per_sequence: int  # chunks of each sequence (a multiple of EVERY)


def make_inputs(folder: Path, *, sequences: int, chunks: int, seed: int) -> Inputs:
    from linstream.pipeline.app.sample import sample_chunks
    from linstream.pipeline.io import write_chunk_file

    model = str(folder / "tiny.safetensors")
    write_tiny_model(model, seed=3)
    all_chunks = sample_chunks(sequences, chunks * 16, 16, seed=seed, shuffle=True, vocab_size=256)
    full, head = str(folder / "in.parquet"), str(folder / "head.parquet")
    write_chunk_file(full, all_chunks)
    write_chunk_file(head, [c for c in all_chunks if c.index < EVERY])
    reference = str(folder / "reference")
    cmd = _embed(model, full, reference, str(folder / "ckpt-ref"), [])
    subprocess.run(cmd, check=True, capture_output=True)
    return Inputs(model, full, head, reference, chunks)


def _embed(model: str, inp: str, out: str, ckpt: str, extra: list[str]) -> list[str]:
    return [
        *LINSTREAM,
        "embed",
        "--model",
        model,
        "--backend",
        "numpy",
        "--input",
        inp,
        "--output",
        out,
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        str(EVERY),
        "--progress-every",
        "0",
        "--runner=FnApiRunner",
        *extra,
    ]


@dataclass
class Expect:
    """What a cell must find after its fault."""

    outputs: list[str]
    #: chunks that may appear twice (a crafted manifest's own chunks)
    may_double: set[tuple[str, int]] = field(default_factory=set)
    #: the paths `checkpoint verify` must name (as it prints them), and no others
    verify_bad: set[str] = field(default_factory=set)
    no_orphans: bool = False
    #: a file outside the store and outputs that must keep its bytes
    outside: tuple[str, bytes] | None = None


class Cell:
    """One (where, fault) cell: its folders, and the jobs it runs (logs under ``work``)."""

    def __init__(
        self, inputs: Inputs, base: str, beam_args: list[str], work: Path, seed: int
    ) -> None:
        self.inputs = inputs
        self.base = base.rstrip("/")
        self.beam_args = beam_args
        self.work = work
        self.rng = np.random.default_rng(seed)
        self.ckpt = self.url("ckpt")
        self.log = str(work / "jobs.log")
        self.notes: list[str] = []  # what the fault did (the printed RESULT line)

    # -- places -------------------------------------------------------------------------
    def url(self, *parts: str) -> str:
        return "/".join((self.base, *parts))

    @property
    def scheme(self) -> str | None:
        return self.base.partition("://")[0] if "://" in self.base else None

    def store_url(self, path: str) -> str:
        """A path as the checkpoint store reports it, as a URL (object stores drop it)."""
        return path if self.scheme is None else f"{self.scheme}://{path}"

    def _fs(self, url: str) -> tuple[Any, str]:
        import fsspec

        return fsspec.core.url_to_fs(url)

    def read(self, url: str) -> bytes:
        fs, path = self._fs(url)
        return bytes(fs.cat_file(path))

    def write(self, url: str, data: bytes) -> None:
        fs, path = self._fs(url)
        if self.scheme is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        fs.pipe_file(path, data)

    def exists(self, url: str) -> bool:
        fs, path = self._fs(url)
        return bool(fs.exists(path))

    def remove(self, url: str) -> None:
        fs, path = self._fs(url)
        fs.rm_file(path)

    def flip(self, url: str) -> None:
        data = bytearray(self.read(url))
        data[len(data) // 2] ^= 1
        self.write(url, bytes(data))

    def newest(self, seq_id: str) -> Any:
        from linstream.state import CheckpointStore

        return CheckpointStore(self.ckpt).commits(seq_id)[0]

    def listing(self) -> str:
        """Every file in the checkpoint store with its time (which writer came last)."""
        fs, root = self._fs(self.ckpt)
        found = fs.find(root, detail=True)
        return "\n".join(
            f"  {path} {info.get('updated') or info.get('mtime') or info.get('LastModified')}"
            for path, info in sorted(found.items())
        )

    # -- jobs ---------------------------------------------------------------------------
    def cmd(self, out: str, *extra: str, inp: str | None = None) -> list[str]:
        i = self.inputs
        return _embed(i.model, inp or i.full, out, self.ckpt, [*extra, *self.beam_args])

    def run(
        self, out: str, *extra: str, inp: str | None = None, **faults: str
    ) -> subprocess.CompletedProcess[str]:
        cmd = self.cmd(out, *extra, inp=inp)
        done = subprocess.run(
            with_faults(cmd) if faults else cmd,
            capture_output=True,
            text=True,
            env=fault_env(**faults) if faults else None,
            timeout=600,
        )
        with open(self.log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\nexit {done.returncode}\n{done.stdout}{done.stderr}\n")
        return done

    def frozen(self, out: str, where: str, n: int, *extra: str) -> Frozen:
        flag = str(self.work / f"frozen-{len(os.listdir(self.work))}.json")
        return Frozen(self.cmd(out, *extra), flag, self.log, freeze=f"{where}:{n}:{flag}")

    def verify(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*LINSTREAM, "checkpoint", "verify", self.ckpt],
            capture_output=True,
            text=True,
            timeout=300,
        )


def _ok(done: subprocess.CompletedProcess[str], *codes: int) -> None:
    codes = codes or (0,)
    text = done.stdout + done.stderr
    assert done.returncode in codes and "Traceback" not in text, (
        f"exit {done.returncode} (expected {codes}):\n{text[-3000:]}"
    )


# -- the faults ------------------------------------------------------------------------------
def plain_stop(cell: Cell) -> Expect:
    where = str(cell.rng.choice(["before-commit", "before-publish"]))
    # before-publish: the job publishes its output group once, after its last commit
    n = int(cell.rng.integers(1, 4)) if where == "before-commit" else 1
    sig = int(cell.rng.choice([signal.SIGKILL, signal.SIGINT]))
    out1, out2 = cell.url("out-1"), cell.url("out-2")
    job = cell.frozen(out1, where, n)
    job.wait_frozen()
    rc = job.stop(sig)
    assert rc != 0, f"the stopped job exited {rc}"
    cell.notes.append(f"{signal.Signals(sig).name} {where} #{n}, exit {rc}")
    _ok(cell.run(out2, "--resume"))
    return Expect([out1, out2])


def twin_job(cell: Cell) -> Expect:
    outs = [cell.url(f"out-{i}") for i in range(2)]
    procs = [
        subprocess.Popen(
            cell.cmd(out, "--resume", "--checkpoint-every", "2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for out in outs
    ]
    for proc in procs:
        log = proc.communicate(timeout=600)[0]
        with open(cell.log, "a") as f:
            f.write(f"$ {' '.join(proc.args)}\nexit {proc.returncode}\n{log}\n")
        assert proc.returncode == 0 and "Traceback" not in log, log[-3000:]
    final = cell.url("out-final")
    _ok(cell.run(final, "--resume"))
    return Expect([*outs, final], no_orphans=True)


def frozen_writer(cell: Cell) -> Expect:
    out_a, out_b, final = cell.url("out-a"), cell.url("out-b"), cell.url("out-final")
    a = cell.frozen(out_a, "before-commit", int(cell.rng.integers(1, 4)))
    a.wait_frozen()
    _ok(cell.run(out_b, "--resume", "--checkpoint-every", "1"))
    rc = a.resume()
    assert rc == 0, f"the frozen job exited {rc} (see {cell.log})"
    cell.notes.append(f"frozen before commit {a.info['commit']} of {a.info['seq_id']}")
    assert cell.verify().returncode == 0  # before anything repairs it
    _ok(cell.run(final, "--resume"))
    return Expect([out_a, out_b, final], no_orphans=True)


def skewed_clock(cell: Cell) -> Expect:
    out_a, final = cell.url("out-a"), cell.url("out-final")
    a = cell.frozen(out_a, "before-commit", int(cell.rng.integers(1, 3)))
    info = a.wait_frozen()
    pending = info["pending"]
    assert pending and cell.exists(pending), info
    b = cell.run(out_a, "--resume", inp=cell.inputs.head, clock_skew_s="3600")
    _ok(b)
    assert cell.exists(pending), "the job an hour ahead removed the frozen writer's output"
    cell.notes.append(f"frozen before commit {info['commit']} of {info['seq_id']}")
    rc = a.resume()
    assert rc == 0, f"the frozen job exited {rc} (see {cell.log})"
    _ok(cell.run(final, "--resume"))
    return Expect([out_a, final], no_orphans=True)


def crafted_manifest(cell: Cell) -> Expect:
    out1, out2 = cell.url("out-1"), cell.url("out-2")
    _ok(cell.run(out1))
    outside = cell.url("outside", "precious.txt")
    known = b"a file that is not linstream's\n" * 64
    cell.write(outside, known)
    newest = cell.newest(SEQ0)
    manifest, data = cell.store_url(newest.manifest_path), cell.store_url(newest.data_path)
    fields = json.loads(cell.read(manifest))
    span = fields["history"]["outputs"]
    span["file"] = outside
    cell.write(manifest, json.dumps(reseal_manifest(fields)).encode())
    cell.flip(data)
    done = cell.run(out2, "--resume", "--restore-fallback")
    _ok(done)
    assert any(newest.manifest_path in ln and "outside" in ln for ln in done.stderr.splitlines()), (
        done.stderr[-3000:]
    )
    forged = {(SEQ0, i) for i in range(span["first_chunk"], span["end_chunk"])}
    bad = {newest.manifest_path, str(newest.data_path)}
    return Expect([out1, out2], may_double=forged, verify_bad=bad, outside=(outside, known))


def damaged_file(cell: Cell) -> Expect:
    out1, out2, out3 = (cell.url(n) for n in ("out-1", "out-2", "out-3"))
    _ok(cell.run(out1))
    # The published file that holds its newest span (the file of the job's output group).
    span = json.loads(cell.read(cell.store_url(cell.newest(SEQ0).manifest_path)))
    result = span["history"]["outputs"]["file"].removesuffix(".parquet") + "-0000.parquet"
    assert cell.exists(result), result
    if cell.rng.random() < 0.5:
        cell.remove(result)
        cell.notes.append("result file deleted")
    else:
        cell.flip(result)
        cell.notes.append("result file damaged")
    newest = cell.newest(SEQ1)
    cell.flip(cell.store_url(newest.data_path))
    refused = cell.run(out2, "--resume")
    _ok(refused, 3)
    assert "restore_failed" in refused.stdout + refused.stderr, refused.stderr[-3000:]
    _ok(cell.run(out3, "--resume", "--restore-fallback"))
    damaged = str(newest.data_path)
    if cell.exists(cell.store_url(damaged)):
        return Expect([out1, out2, out3], verify_bad={damaged})
    # Gone only the way retention removes any commit: its sequence made two newer ones (its
    # outputs were in the deleted file too, so it was computed again from its first chunk).
    assert newest.commit is not None and cell.newest(SEQ1).commit >= newest.commit + 2
    cell.notes.append(f"the damaged commit {newest.commit} was retired by two newer ones")
    return Expect([out1, out2, out3])


_FAULTS = {
    "plain-stop": plain_stop,
    "twin-job": twin_job,
    "frozen-writer": frozen_writer,
    "skewed-clock": skewed_clock,
    "crafted-manifest": crafted_manifest,
    "damaged-file": damaged_file,
}


def run_cell(cell: Cell, fault: str) -> list[str]:
    """Run ``fault`` in ``cell``; the problems found afterwards (empty: the cell passes)."""
    expect = _FAULTS[fault](cell)
    problems = []
    verdict = judge(cell.inputs.reference, expect.outputs)
    doubled = set(verdict.duplicated) - expect.may_double
    if verdict.lost or verdict.mismatched or verdict.unexpected or doubled:
        problems.append(f"results: {verdict}")
    verify = cell.verify()
    text = verify.stdout + verify.stderr
    bad = {ln[4:].split(": ", 1)[0] for ln in verify.stdout.splitlines() if ln.startswith("BAD ")}
    if bad != expect.verify_bad or verify.returncode != (1 if expect.verify_bad else 0):
        problems.append(f"verify: expected {sorted(expect.verify_bad)} bad, got:\n{text}")
    if "Traceback" in text or (expect.no_orphans and "orphan" in text):
        problems.append(f"verify: {text}\nthe store then held:\n{cell.listing()}")
    if expect.outside is not None:
        url, known = expect.outside
        if not cell.exists(url) or cell.read(url) != known:
            problems.append(f"{url} outside the store and outputs was changed or removed")
    print(
        f"RESULT {fault} ({'; '.join(cell.notes) or '-'}): {len(expect.outputs)} jobs' results, "
        f"{verdict}, doubled as allowed {len(set(verdict.duplicated) & expect.may_double)}; "
        f"verify named {len(bad)} of {len(expect.verify_bad)} damaged file(s); "
        f"{len(problems)} problem(s)"
    )
    return problems
