"""Start-up as a user meets it: whole processes, each beside the same run on the code before the
Numba cache was fixed (BASE_COMMIT, taken from git history into a temporary folder).

    .venv/bin/python -m pytest tests/bench/test_bench_startup.py -m bench -s -p no:randomly

Both sides run the same interpreter and dependencies; only the `linstream` sources differ (each
side's `ops/`, `state/`, `pipeline/` and `deploy/`, imported through a folder of links on
PYTHONPATH), and each side has its own NUMBA_CACHE_DIR.  The rounds are interleaved (before, now,
before, now, ...); the best of ROUNDS counts, every round is printed.  Timed with /usr/bin/time
(wall seconds of the whole process, Python's start included):

- embed: `linstream embed` of 3 small text files into a new folder, after a first run on the
  same cache (the user's second run; target <= 3 s);
- first call: a new Python process importing `linstream.ops` and making its first
  `causal_linear_attention` call on a shape it has used before (target <= 1 s);
- first chunk: `deploy/first_chunk_time.py --runs 1` after each side's warm-up (`linstream
  warmup`, what the worker images run), its own figure: seconds from spawning a
  fresh interpreter to the first applied 64-token chunk of builtin:default (target <= 2 s).

The cold figures (the first run of each, on an empty cache of its own) are printed too.
The run's table is printed and written to build/bench/startup.md; docs/benchmarks.md carries
the tables of record.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.bench_report import report

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
#: `linstream warmup` on each side (before, the module ran by itself)
WARMUP = {
    "before": ["-m", "linstream.ops.warmup"],
    "now": ["-m", "linstream.pipeline.app.cli", "warmup"],
}
BASE_COMMIT = "a8538f8"  # main before the cache fix: the additive kernel compiled in every process
ROUNDS = int(os.environ.get("LINSTREAM_BENCH_ROUNDS", 5))
COMMAND = "pytest tests/bench/test_bench_startup.py -m bench -s -p no:randomly"
PACKAGES = ("ops", "state", "pipeline")
TEXTS = {
    "a.txt": "The first small file.\n",
    "b.txt": "A second one, a little longer than the first.\n",
    "c.txt": "And a third.\n",
}
FIRST_CALL = """
import numpy as np
from linstream.ops import causal_linear_attention
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((256, 4, 32), dtype=np.float32) for _ in range(3))
out, state = causal_linear_attention(q, k, v)
assert np.isfinite(out).all()
"""


@dataclass(frozen=True)
class Side:
    """One side of the comparison: where it runs, its sources, its environment."""

    cwd: Path
    src: Path
    env: dict[str, str]

    def with_cache(self, folder: Path) -> Side:
        return Side(self.cwd, self.src, {**self.env, "NUMBA_CACHE_DIR": str(folder)})


def _side(root: Path, name: str, commit: str | None) -> Side:
    """A folder of links that imports as `linstream` (the sources of `commit`, or of this
    working tree when None), and the environment that runs it with its own Numba cache."""
    src = root / name / "src"
    src.mkdir(parents=True)
    if commit is None:
        for p in (*PACKAGES, "deploy"):
            (src / p).symlink_to(ROOT / p)
    else:
        archive = subprocess.run(
            ["git", "archive", commit, *PACKAGES, "deploy"], cwd=ROOT, capture_output=True,
            check=True,
        ).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    tree = root / name / "tree" / "linstream"
    tree.mkdir(parents=True)
    for p in PACKAGES:
        (tree / p).symlink_to(src / p)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(tree.parent), NUMBA_CACHE_DIR=str(root / name / "numba-cache"))
    for rel, text in TEXTS.items():
        path = root / name / "in" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Side(root / name, src, env)


def _timed(side: Side, args: list[str], label: str) -> float:
    """Wall seconds of `python ARGS` in the side's environment, by /usr/bin/time."""
    tfile = side.cwd / "time.txt"
    proc = subprocess.run(
        ["/usr/bin/time", "-o", str(tfile), "-f", "%e", sys.executable, *args],
        cwd=side.cwd, env=side.env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"{label}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    return float(tfile.read_text().split()[-1])


def _embed(side: Side, n: int) -> float:
    out = side.cwd / f"out-{n}"
    cli = ["-m", "linstream.pipeline.app.cli", "embed", "--input", "in", "--output", str(out)]
    seconds = _timed(side, cli, "embed")
    assert list((out / "results").glob("*.parquet")), f"embed wrote no results under {out}"
    shutil.rmtree(out)
    return seconds


def _first_chunk(side: Side) -> float:
    proc = subprocess.run(
        [sys.executable, str(side.src / "deploy" / "first_chunk_time.py"), "--runs", "1"],
        cwd=side.cwd, env=side.env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float(proc.stdout.split("first chunk after ")[1].split()[0].rstrip(";,"))


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def test_bench_startup_against_the_code_before():
    root = Path(tempfile.mkdtemp(prefix="linstream-startup-"))
    sides = {"before": _side(root, "before", BASE_COMMIT), "now": _side(root, "now", None)}
    # each measure on a cache of its own; first_chunk_time.py on one the worker images' warm-up
    # filled (after its cold figure, on that cache still empty)
    call = {name: side.with_cache(side.cwd / "call-cache") for name, side in sides.items()}
    workers = {name: side.with_cache(side.cwd / "worker-cache") for name, side in sides.items()}
    load_before = _load()
    cold: dict[str, dict[str, float]] = {name: {} for name in sides}
    warm: dict[str, dict[str, list[float]]] = {
        name: {"embed": [], "first call": [], "first chunk": []} for name in sides
    }
    for name, side in sides.items():  # the first runs, on empty caches
        cold[name]["embed"] = _embed(side, 0)
        cold[name]["first call"] = _timed(call[name], ["-c", FIRST_CALL], "first call")
        cold[name]["first chunk"] = _first_chunk(workers[name])
        shutil.rmtree(workers[name].env["NUMBA_CACHE_DIR"])
        _timed(workers[name], WARMUP[name], "warm-up")
    for r in range(ROUNDS):
        for name, side in sides.items():
            warm[name]["embed"].append(_embed(side, r + 1))
            warm[name]["first call"].append(_timed(call[name], ["-c", FIRST_CALL], "first call"))
            warm[name]["first chunk"].append(_first_chunk(workers[name]))
        print(f"round {r + 1}: {warm}", flush=True)
    targets = {"embed": 3.0, "first call": 1.0, "first chunk": 2.0}
    what = {
        "embed": "second `linstream embed` of 3 small text files, wall s",
        "first call": "new process: import linstream.ops + first causal_linear_attention, wall s",
        "first chunk": "deploy/first_chunk_time.py after the warm-up, s to the first chunk",
    }
    lines = [
        f"One run, {ROUNDS} interleaved rounds, best (all rounds); load average (1, 5, 15 min) "
        f"{load_before} before, {_load()} after; {os.cpu_count()} CPUs; before = {BASE_COMMIT}",
        "",
        "| measure | before | now | target | cold cache: before, now |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in what.items():
        cells = [
            f"{min(warm[s][key]):.2f} ({', '.join(f'{x:.1f}' for x in warm[s][key])})"
            for s in sides
        ]
        lines.append(
            f"| {label} | {cells[0]} | {cells[1]} | <= {targets[key]:g} | "
            f"{cold['before'][key]:.1f}, {cold['now'][key]:.1f} |"
        )
    report("startup", "\n".join(lines), header=f"# Start-up benchmark\n\nCommand: `{COMMAND}`")
    shutil.rmtree(root, ignore_errors=True)
