"""A crash harness: run `linstream embed` in a subprocess, stop it at random moments (SIGKILL or
SIGINT), resume over the full input, and judge the union of every job's written outputs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.cli"]


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


def result_rows(output: str) -> list[tuple[tuple[str, int], int, bytes]]:
    """Every row of every published result file under ``output``: (key, start, vector bytes)."""
    rows = []
    root = os.path.join(output, "results")
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in sorted(files):
            if name.startswith((".", "_")):
                continue
            table = pq.read_table(os.path.join(folder, name))
            col = "embeddings" if "embeddings" in table.column_names else "embedding"
            values = table.column(col).to_pylist()
            for s, i, p, v in zip(
                table.column("seq_id").to_pylist(),
                table.column("chunk_index").to_pylist(),
                table.column("start_position").to_pylist(),
                values,
                strict=True,
            ):
                rows.append(((s, int(i)), int(p), np.asarray(v, np.float32).tobytes()))
    return rows


@dataclass
class Verdict:
    """How the union of all jobs' outputs compares with one uninterrupted run."""

    lost: list[tuple[str, int]] = field(default_factory=list)
    duplicated: list[tuple[str, int]] = field(default_factory=list)
    mismatched: list[tuple[str, int]] = field(default_factory=list)
    unexpected: list[tuple[str, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.mismatched or self.unexpected)

    def __str__(self) -> str:
        return (
            f"lost {len(self.lost)}, duplicated {len(self.duplicated)}, mismatched "
            f"{len(self.mismatched)}, unexpected {len(self.unexpected)} "
            f"(first: {(self.lost + self.duplicated + self.mismatched + self.unexpected)[:5]})"
        )


def judge(reference_out: str, outputs: list[str]) -> Verdict:
    ref = {k: (p, v) for k, p, v in result_rows(reference_out)}
    rows = [r for out in outputs for r in result_rows(out)]
    counts = Counter(k for k, _, _ in rows)
    verdict = Verdict()
    verdict.duplicated = sorted(k for k, n in counts.items() if n > 1)
    verdict.lost = sorted(set(ref) - set(counts))
    verdict.unexpected = sorted(set(counts) - set(ref))
    verdict.mismatched = sorted({k for k, p, v in rows if k in ref and ref[k] != (p, v)})
    return verdict


@dataclass
class Stop:
    signal: int
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


def _has_results(out: str) -> bool:
    return any(files for _folder, _dirs, files in os.walk(os.path.join(out, "results")))


def first_output_time(cmd: list[str], out: str) -> tuple[float, float]:
    """Run ``cmd`` to the end: (seconds until its first output file, seconds in all)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while proc.poll() is None:
        if first is None and _has_results(out):
            first = time.monotonic() - t0
        time.sleep(0.01)
    total = time.monotonic() - t0
    if proc.returncode != 0:
        msg = f"{cmd} failed with exit code {proc.returncode}"
        raise AssertionError(msg)
    return (total if first is None else first), total


def run_until(
    cmd: list[str], out: str, stop: Stop, log: str, env: dict[str, str] | None = None
) -> Stop:
    """Start ``cmd``; once it has published its first output (so the job is past start-up and
    committing), send ``stop.signal`` after ``stop.after_s`` more seconds (unless it ended)."""
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=f, start_new_session=True, env=env)
        start_by = time.monotonic() + 60
        while time.monotonic() < start_by and proc.poll() is None and not _has_results(out):
            time.sleep(0.01)
        deadline = time.monotonic() + stop.after_s
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        if proc.poll() is None:
            # The whole process group: multi_processing workers get it too, as from a terminal.
            os.killpg(proc.pid, stop.signal)
        try:
            stop.returncode = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stop.returncode = proc.wait()
    return stop


def crash_and_resume(
    seed: int,
    model: str,
    inp: str,
    workdir: str,
    reference_out: str,
    *,
    kills: int,
    duration_s: float,
    extra: tuple[str, ...] = (),
) -> tuple[Verdict, list[Stop]]:
    """``kills`` stopped jobs (random signal and moment), then one resume to the end.
    ``duration_s``: how long a job runs past its first output (stops fall within it)."""
    rng = np.random.default_rng(seed)
    ckpt = os.path.join(workdir, "ckpt")
    outputs, stops = [], []
    log = os.path.join(workdir, "jobs.log")
    for k in range(kills):
        out = os.path.join(workdir, f"out-{k}")
        outputs.append(out)
        sig = signal.SIGKILL if rng.random() < 0.5 else signal.SIGINT
        # Early stops are likelier (each job resumes with less left to do): a stop lands while
        # the job still works, anywhere from its first commit on.
        after = float(min(rng.exponential(duration_s / 4), duration_s))
        resume = ("--resume",) if k else ()
        cmd = embed_cmd(model, inp, out, ckpt, *resume, *extra)
        trace = os.path.join(workdir, f"applied-{k}.tsv")
        env = {**os.environ, "LINSTREAM_TRACE_APPLIED": trace}
        stop = run_until(cmd, out, Stop(sig, after), log, env)
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
