"""A crash harness: run `linstream embed` in a subprocess, stop it at random moments (SIGKILL or
SIGINT), resume over the full input, and judge the union of every job's written outputs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from helpers.outputs import Verdict, judge, result_rows

__all__ = [
    "LINSTREAM",
    "Stop",
    "Verdict",
    "commits_made",
    "crash_and_resume",
    "embed_cmd",
    "judge",
    "recomputed_after",
    "reference_files",
    "result_rows",
    "run_until",
]

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.app.cli"]


def embed_cmd(model: str, inp: str, out: str, ckpt: str, *extra: str) -> list[str]:
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
        "--progress-every",
        "0",
        *extra,
    ]


@dataclass
class Stop:
    signal: int
    after_files: int
    after_s: float
    returncode: int | None = None
    #: per sequence: chunks the stopped job had applied past its last commit (recomputed later)
    recomputed: dict[str, int] = field(default_factory=dict)


def recomputed_after(trace: str, ckpt: str) -> dict[str, int]:
    """Chunks applied (per the trace) at or past each sequence's newest commit."""
    from linstream.state import CheckpointStore

    applied: dict[str, set[int]] = {}
    if os.path.exists(trace):
        with open(trace) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 2 and parts[1].isdigit():
                    applied.setdefault(parts[0], set()).add(int(parts[1]))
    store = CheckpointStore(ckpt)
    out = {}
    for seq, idxs in applied.items():
        head = store.head(seq, fingerprint=None, fallback=True)
        done = 0 if head is None else head.state.next_chunk
        out[seq] = sum(1 for i in idxs if i >= done)
    return out


def commits_made(ckpt: str) -> int:
    """How many commits the checkpoint folder ``ckpt`` has seen: the sum of each sequence's
    newest commit number (retention removes old commit files, never their numbers)."""
    n = 0
    for _folder, _dirs, files in os.walk(ckpt):
        numbers = [int(f.split(".")[0]) for f in files if f.endswith(".commit.json")]
        n += max(numbers, default=0)
    return n


def reference_files(cmd: list[str], ckpt: str) -> int:
    """Run ``cmd`` to the end; the number of commits it made in ``ckpt``."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        msg = f"{cmd} failed with exit code {done.returncode}: {done.stderr[-2000:]}"
        raise AssertionError(msg)
    return commits_made(ckpt)


def run_until(
    cmd: list[str], ckpt: str, stop: Stop, log: str, env: dict[str, str] | None = None
) -> Stop:
    """Start ``cmd``; once it has made ``stop.after_files`` commits in ``ckpt`` (so it is in the
    middle of its commits), wait ``stop.after_s`` more seconds and send ``stop.signal`` (unless
    it ended by then)."""
    before = commits_made(ckpt)
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=f, start_new_session=True, env=env)
        start_by = time.monotonic() + 120
        while (
            time.monotonic() < start_by
            and proc.poll() is None
            and commits_made(ckpt) - before < stop.after_files
        ):
            time.sleep(0.005)
        deadline = time.monotonic() + stop.after_s
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.005)
        if proc.poll() is None:
            # The whole process group: multi_processing workers get it too, as from a terminal.
            os.killpg(proc.pid, stop.signal)
        try:
            stop.returncode = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stop.returncode = proc.wait()
    return stop


def _left(ckpt: str, total: int) -> float:
    """The fraction of all chunks not committed yet in ``ckpt``."""
    from linstream.state import CheckpointStore

    store = CheckpointStore(ckpt)
    if not store.exists():
        return 1.0
    done = 0
    for seq in store.sequences():
        head = store.head(seq, fingerprint=None, fallback=True)
        done += 0 if head is None else head.state.next_chunk
    return max(1.0 - done / max(total, 1), 0.05)


def crash_and_resume(
    seed: int,
    model: str,
    inp: str,
    workdir: str,
    reference_out: str,
    *,
    kills: int,
    files: int,
    extra: tuple[str, ...] = (),
) -> tuple[Verdict, list[Stop]]:
    """``kills`` stopped jobs (random signal and moment), then one resume to the end.
    ``files``: how many commits an uninterrupted run makes (stops fall within them)."""
    rng = np.random.default_rng(seed)
    ckpt = os.path.join(workdir, "ckpt")
    total = len(result_rows(reference_out))
    outputs, stops = [], []
    log = os.path.join(workdir, "jobs.log")
    for k in range(kills):
        out = os.path.join(workdir, f"out-{k}")
        outputs.append(out)
        sig = signal.SIGKILL if rng.random() < 0.5 else signal.SIGINT
        # A moment while the job still works (a resumed job has only what is left to do): after
        # a random number of its commits, plus up to 50 ms so that stops also land inside one.
        left = max(1, round(files * _left(ckpt, total)))
        after_files = int(rng.integers(1, left + 1))
        after = float(rng.uniform(0.0, 0.05))
        resume = ("--resume",) if k else ()
        cmd = embed_cmd(model, inp, out, ckpt, *resume, *extra)
        trace = os.path.join(workdir, f"applied-{k}.tsv")
        env = {**os.environ, "LINSTREAM_TRACE_APPLIED": trace}
        stop = run_until(cmd, ckpt, Stop(sig, after_files, after), log, env)
        stop.recomputed = recomputed_after(trace, ckpt)
        stops.append(stop)
    out = os.path.join(workdir, "out-final")
    outputs.append(out)
    done = subprocess.run(
        embed_cmd(model, inp, out, ckpt, "--resume", *extra), capture_output=True, text=True
    )
    if done.returncode != 0:
        msg = f"the final resume failed ({done.returncode}): {done.stderr[-2000:]}"
        raise AssertionError(msg)
    return judge(reference_out, outputs), stops
