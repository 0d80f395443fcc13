"""The embed job on each engine against FnApiRunner, same input, one run (`make bench`):
tokens/s and whole-command wall time per engine, rounds interleaved; and each engine's start-up:
the job server from its start to an open port, and its first job against its later ones.

    .venv/bin/python -m pytest tests/bench/test_bench_engines.py -m bench -s

Engines as the engine tests run them (tests/engines/): Beam's Flink job server (embedded Flink
1.19 cluster, parallelism 2) and Spark job server (Spark 3.5, local[2]), each with LOOPBACK
Python workers, and Prism (`--runner=PrismRunner`, which starts the Prism binary for each job).
The input: 8 sequences of 16 chunks of 256 tokens, shuffled, into `builtin:default` on the
Numba kernels (compiled before timing), checkpoints every 16 chunks.  The run's table is printed
and written to build/bench/engines.md; docs/benchmarks.md carries the tables of record.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from helpers.bench_report import report
from helpers.engine_jobs import LINSTREAM, run
from helpers.engine_servers import need, start_job_server, stop_all

pytestmark = pytest.mark.bench

ROUNDS = int(os.environ.get("LINSTREAM_BENCH_ROUNDS", "3"))
SEQUENCES, CHUNKS, TOKENS = 8, 16, 256
_LINE = re.compile(r"([\d,]+) tokens in ([\d.]+) s \(([\d,]+) tokens/s\)")


def _cmd(inp: str, out: str, ckpt: str, *runner: str) -> list[str]:
    return [
        LINSTREAM,
        "embed",
        "--input",
        inp,
        "--output",
        out,
        "--checkpoint-dir",
        ckpt,
        "--backend",
        "numba",
        "--progress-every",
        "0",
        *runner,
    ]


def _timed(cmd: list[str]) -> tuple[float, float, int]:
    """(pipeline seconds as the job reports them, whole command seconds, tokens)."""
    t0 = time.perf_counter()
    printed = run(cmd)
    wall = time.perf_counter() - t0
    m = _LINE.search(printed)
    assert m, printed[-2000:]
    return float(m.group(2)), wall, int(m.group(1).replace(",", ""))


def test_engines_against_fn_api_runner(tmp_path):
    from linstream.pipeline.app.sample import sample_chunks
    from linstream.pipeline.io import write_chunk_file

    prism = need("prism")
    need("flink")
    need("spark")
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, sample_chunks(SEQUENCES, CHUNKS * TOKENS, TOKENS, seed=5, shuffle=True))
    load = os.getloadavg()
    # Compile the kernels once (the Numba cache serves every later process).
    run(_cmd(inp, str(tmp_path / "warm"), str(tmp_path / "warm-ckpt"), "--runner=FnApiRunner"))

    servers, startup = {}, {}
    try:
        for engine in ("flink", "spark"):
            server = start_job_server(engine, tmp_path / f"{engine}-job-server")
            servers[engine] = server
            startup[engine] = server.started_s
        t0 = time.perf_counter()
        from helpers.engine_servers import free_port, start_server

        port = free_port()
        p = start_server(
            "prism",
            [prism, "--job_port", str(port), "--serve_http=false"],
            tmp_path / "prism",
            {"job": port},
            jvm=False,
        )
        startup["prism"] = time.perf_counter() - t0
        p.stop()

        runners = {
            "FnApiRunner": ("--runner=FnApiRunner",),
            "Flink": (
                "--runner=PortableRunner",
                f"--job_endpoint={servers['flink'].endpoint()}",
                "--environment_type=LOOPBACK",
                "--parallelism=2",
            ),
            "Spark": (
                "--runner=PortableRunner",
                f"--job_endpoint={servers['spark'].endpoint()}",
                "--environment_type=LOOPBACK",
            ),
            "Prism": ("--runner=PrismRunner", f"--prism_location={prism}"),
        }
        times: dict[str, list[tuple[float, float, int]]] = {k: [] for k in runners}
        for r in range(ROUNDS):
            for name, args in runners.items():
                out, ckpt = tmp_path / f"{name}-{r}", tmp_path / f"{name}-{r}-ckpt"
                times[name].append(_timed(_cmd(inp, str(out), str(ckpt), *args)))
    finally:
        for server in servers.values():
            server.stop()
        stop_all()
    load_after = os.getloadavg()

    base = min(t[0] for t in times["FnApiRunner"])
    lines = [
        f"Input {SEQUENCES} sequences x {CHUNKS} chunks x {TOKENS} tokens "
        f"({SEQUENCES * CHUNKS * TOKENS:,} tokens), builtin:default, numba, {ROUNDS} rounds "
        f"interleaved; load average before {load[0]:.1f}, after {load_after[0]:.1f}.",
        "",
        "| runner | job start-up (s) | first job: pipeline s / command s | later jobs, best: "
        "pipeline s / command s | tokens/s (best) | vs FnApiRunner |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, runs in times.items():
        first, later = runs[0], runs[1:] or runs
        best = min(later, key=lambda t: t[0])
        key = name.lower()
        up = f"{startup[key]:.1f}" if key in startup else "—"
        lines.append(
            f"| {name} | {up} | {first[0]:.1f} / {first[1]:.1f} | {best[0]:.1f} / "
            f"{best[1]:.1f} | {best[2] / best[0]:,.0f} | {base / best[0]:.2f}x |"
        )
    report(
        "engines",
        "\n".join(lines),
        header="# The embed job on each engine (tests/bench/test_bench_engines.py)\n\n"
        "`.venv/bin/python -m pytest tests/bench/test_bench_engines.py -m bench -s`",
    )
    for name, runs in times.items():
        assert all(t[2] == SEQUENCES * CHUNKS * TOKENS for t in runs), name
