"""The job at small and large chunks (`make bench`): `linstream embed --emit mean` with checkpoints
(FnApiRunner, one worker, builtin:default, the backend `LINSTREAM_BENCH_BACKEND`, default "auto" as
`linstream embed` runs without flags, i.e. numba on a CPU) over 200 interleaved sequences, against a
plain loop over the model runtime on the same chunks (read the same file, order, embed, take the
mean; write nothing) in the same process, interleaved, best of LINSTREAM_BENCH_ROUNDS rounds
(each round's ratio is printed too, by wall time and by process CPU time, which the other work
on a shared machine moves less).  Targets: job >= 70% of the loop at 64-token chunks, >= 90% at
2048.  Writes docs/img/job-vs-loop.png (job-vs-loop-BACKEND.png for another backend).
LINSTREAM_BENCH_CHUNKS=64,2048 runs only those chunk sizes (the plot is then not written).

    .venv/bin/python -m pytest tests/bench/test_bench_job_chunks.py -m bench -s
    LINSTREAM_BENCH_BACKEND=numpy .venv/bin/python -m pytest \
        tests/bench/test_bench_job_chunks.py -m bench -s
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers.plotting import IMG_DIR, line_plot
from linstream.ops import load_model
from linstream.pipeline.app.job import run_embed
from linstream.pipeline.app.options import EmbedConfig
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import table_to_chunks, write_chunk_file

pytestmark = pytest.mark.bench

SEQUENCES = 200
BACKEND = os.environ.get("LINSTREAM_BENCH_BACKEND", "auto")
#: (chunk size, chunks per sequence)
SHAPES = [(64, 24), (256, 8), (2048, 2)]
_ONLY = os.environ.get("LINSTREAM_BENCH_CHUNKS")
if _ONLY:
    SHAPES = [s for s in SHAPES if str(s[0]) in _ONLY.split(",")]


def _loop(path, model):
    t0 = time.perf_counter()
    chunks = sorted(table_to_chunks(pq.read_table(path)), key=lambda c: (c.seq_id, int(c.index)))
    states, tokens = {}, 0
    for c in chunks:
        emb, states[c.seq_id] = model.embed_chunk(
            c.data, states.get(c.seq_id) or model.initial_states(), backend=BACKEND
        )
        emb.mean(axis=0, dtype=np.float64)
        tokens += len(c.data)
    return tokens, time.perf_counter() - t0


def test_job_against_a_plain_loop_by_chunk_size(tmp_path):
    model = load_model("builtin:default")
    model.embed_chunk(np.zeros(8, np.int32), model.initial_states(), backend=BACKEND)
    rounds = int(os.environ.get("LINSTREAM_BENCH_ROUNDS", 1))
    rows = []
    for size, per_seq in SHAPES:
        chunks = sample_chunks(SEQUENCES, size * per_seq, size, seed=size, shuffle=True)
        path = str(tmp_path / f"in-{size}.parquet")
        write_chunk_file(path, chunks)
        # Compile (or load) the kernels this chunk size uses before either side is timed.
        model.embed_chunk(np.zeros(size, np.int32), model.initial_states(), backend=BACKEND)
        loop_s, job, ratios = float("inf"), None, []
        for r in range(rounds):
            c0 = time.process_time()
            loop_tokens, t = _loop(path, model)
            loop_cpu = time.process_time() - c0
            loop_s = min(loop_s, t)
            args = argparse.Namespace(
                input=path,
                model="builtin:default",
                resume=False,
                emit="mean",
                backend=BACKEND,
                checkpoint_every=16,
                max_buffered_chunks=None,
                idle_timeout=300.0,
                state_dtype="float64",
                num_shards=0,
                progress_every=0,
                streaming=False,
                output=str(tmp_path / f"out-{size}-{r}"),
                checkpoint_dir=str(tmp_path / f"ckpt-{size}-{r}"),
            )
            c0 = time.process_time()
            run = run_embed(EmbedConfig.from_args(args), [])
            job_cpu = time.process_time() - c0
            ratios.append(f"{t / run.wall_s:.0%} (CPU {loop_cpu / job_cpu:.0%})")
            if job is None or run.wall_s < job.wall_s:
                job = run
        assert job is not None and job.tokens == loop_tokens
        rows.append((size, loop_tokens, loop_tokens / loop_s, job.tokens_per_s, job.wall_s))
        print(f"\nchunk {size}: job / loop per round: {', '.join(ratios)}")
    print(f"\nbackend {BACKEND}")
    print("| chunk | tokens | loop tokens/s | job tokens/s | job / loop | job wall s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size, tokens, loop, job_rate, wall in rows:
        print(
            f"| {size} | {tokens:,} | {loop:,.0f} | {job_rate:,.0f} | "
            f"{job_rate / loop:.0%} | {wall:.1f} |"
        )
    if _ONLY:
        return
    line_plot(
        IMG_DIR / ("job-vs-loop.png" if BACKEND == "auto" else f"job-vs-loop-{BACKEND}.png"),
        f"linstream embed vs a plain loop, {SEQUENCES} sequences, builtin:default, "
        f"backend {BACKEND}",
        {
            "plain loop over embed_chunk": ([r[0] for r in rows], [r[2] for r in rows]),
            "linstream embed (checkpoints, --emit mean)": (
                [r[0] for r in rows],
                [r[3] for r in rows],
            ),
        },
        xlabel="chunk size (tokens)",
        ylabel="tokens/s",
    )
