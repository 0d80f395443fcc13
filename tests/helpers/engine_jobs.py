"""The job the engine tests run on every engine, as a user runs it: `linstream embed` in a
subprocess (through deploy/<engine>/launch.sh where there is one), and the checks on what it
wrote (results bit-identical to the FnApiRunner run, the same dead letters)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers.engine_servers import ROOT, Server

LINSTREAM_BIN = os.path.join(os.path.dirname(sys.executable), "linstream")
LINSTREAM = LINSTREAM_BIN if os.path.exists(LINSTREAM_BIN) else shutil.which("linstream") or ""
#: What every engine run adds to its command: the small test model on NumPy kernels (no Numba
#: compilation in each fresh worker), a commit every 2 chunks, no progress lines.
JOB_ARGS = ("--backend", "numpy", "--checkpoint-every", "2", "--progress-every", "0")
#: Seconds a batch job on an engine may take (the first job on a fresh Flink cluster takes ~30 s
#: on a quiet 2-vCPU machine).
JOB_TIMEOUT_S = 600


@dataclass(frozen=True)
class Case:
    """One input and the FnApiRunner run of it."""

    input: str
    reference: str  # the --output of the FnApiRunner run
    chunks: int  # distinct valid chunks
    dead_letters: int


def write_case_input(path: Path, seed: int, *, bad: bool = True) -> tuple[int, int]:
    """Shuffled, duplicated chunks of 5 sequences, and (``bad``) 3 that must be dead letters;
    returns (distinct valid chunks, dead letters)."""
    from linstream.pipeline.app.sample import sample_chunks
    from linstream.pipeline.elements import Chunk
    from linstream.pipeline.io import write_chunk_file

    chunks = sample_chunks(5, 8 * 16, 16, seed=seed, shuffle=True, duplicates=6, vocab_size=256)
    valid = len({(c.seq_id, c.index) for c in chunks})
    rejected = [
        Chunk("seq-0001", 8, np.arange(16, dtype=np.int32)),  # after_final (final is 7)
        Chunk("unknown-token", 0, np.array([1, 2, 999], dtype=np.int32), final=True),
        Chunk("empty", 0, np.array([], dtype=np.int32), final=True),
    ]
    if not bad:
        rejected.clear()
    rng = np.random.default_rng(seed)
    for c in rejected:  # somewhere in the middle
        chunks.insert(int(rng.integers(0, len(chunks))), c)
    write_chunk_file(str(path), chunks)
    return valid, len(rejected)


def embed_cmd(model: str, inp: str, out: str, ckpt: str, *extra: str) -> list[str]:
    return [
        LINSTREAM,
        "embed",
        "--model",
        model,
        "--input",
        inp,
        "--output",
        out,
        "--checkpoint-dir",
        ckpt,
        *JOB_ARGS,
        *extra,
    ]


def launch_env(
    engine: str, server: Server, model: str, inp: str, out: str, ckpt: str, **more: str
) -> dict[str, str]:
    """The environment of deploy/<engine>/launch.sh for a job on ``server`` (a job server on
    this machine, hence LOOPBACK workers)."""
    env = {
        **os.environ,
        "LINSTREAM": LINSTREAM,
        "JOB_ENDPOINT": server.endpoint("job"),
        "ARTIFACT_ENDPOINT": server.endpoint("artifact"),
        "EXPANSION_ENDPOINT": server.endpoint("expansion"),
        "ENVIRONMENT_TYPE": "LOOPBACK",
        "MODEL": model,
        "INPUT": inp,
        "OUTPUT": out,
        "CHECKPOINT_DIR": ckpt,
        **more,
    }
    if engine == "spark":
        env.setdefault("SPARK_MASTER_URL", "local[2]")
    return env


def launch_cmd(engine: str, *extra: str) -> list[str]:
    return [str(ROOT / "deploy" / engine / "launch.sh"), *JOB_ARGS, *extra]


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = JOB_TIMEOUT_S) -> str:
    """Run a job to its end; its output, or an AssertionError with the end of it."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its process group: what it starts (Prism) goes with it
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything it left, or all of it on a timeout
    took = time.monotonic() - t0
    assert proc.returncode == 0, f"exit {proc.returncode} after {took:.0f} s: {cmd}\n{out[-4000:]}"
    return out


def summary_line(output: str) -> str:
    """The `linstream embed: N chunks, ... tokens/s ...` line of a job's output."""
    lines = [x for x in output.splitlines() if x.startswith("linstream embed:") and "chunks," in x]
    assert lines, output[-3000:]
    return lines[-1]


def dead_letters(out: str) -> list[tuple[str, int | None, str, str]]:
    """The dead letters under ``out``, in a total order."""
    from linstream.pipeline.io import read_dead_letters

    rows = read_dead_letters(out)
    return sorted(
        ((d["seq_id"], d["chunk_index"], d["reason"], d["message"]) for d in rows),
        key=lambda t: json.dumps(t),
    )


def assert_same_results(reference: str, out: str, chunks: int) -> None:
    """``out`` holds every chunk of ``reference`` once, bit for bit, and nothing else."""
    from linstream.pipeline.io import read_results

    want, got = read_results(reference), read_results(out)
    assert len(want) == chunks
    assert sorted(got) == sorted(want)
    for key, (start, vec) in want.items():
        assert got[key][0] == start, key
        assert got[key][1].dtype == vec.dtype and got[key][1].tobytes() == vec.tobytes(), key
