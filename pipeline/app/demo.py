"""`linstream demo`: sample, embed part of the data, stop, resume on the rest, compare with one run.

Three real Beam jobs on the local runner:
  1. part 1 — for every sequence its first chunks (a different number per sequence: where a
     stopped job would have left it), shuffled, some rows sent twice, committing to a
     checkpoint store; the job ends (the "stop");
  2. part 2 — a new job over the remaining chunks with --resume, continuing every sequence from
     its last checkpoint;
  3. one uninterrupted job over all chunks.
The union of the outputs of 1 and 2 must equal the outputs of 3, chunk by chunk.  The kernels
are compiled (or loaded from Numba's cache) before the jobs, so that the jobs' tokens/s are
theirs; each line says what its numbers count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
from linstream.pipeline.io import read_dead_letters, read_results, write_chunk_file

from .job import JobSummary, run_embed
from .options import EmbedConfig
from .sample import model_input, sample_chunks

#: What the counters of a job line mean, said once (docs/reference.md has every counter).
_COUNTERS = (
    "  (duplicates: rows sent twice, dropped; buffered: chunks that came before an earlier chunk "
    "of their sequence and waited for it; gaps: times a sequence waited for a missing chunk)"
)

__all__ = ["compare_results", "run_demo"]


def compare_results(
    a: dict[tuple[str, int], tuple[int, np.ndarray]],
    b: dict[tuple[str, int], tuple[int, np.ndarray]],
) -> tuple[list[str], float]:
    """(problems, max abs difference) between two {(seq, chunk): (start, output)} maps."""
    problems: list[str] = []
    missing = sorted(set(a) - set(b))
    extra = sorted(set(b) - set(a))
    if missing:
        problems.append(f"{len(missing)} chunk(s) missing, e.g. {missing[:3]}")
    if extra:
        problems.append(f"{len(extra)} unexpected chunk(s), e.g. {extra[:3]}")
    worst = 0.0
    for key in sorted(set(a) & set(b)):
        (pa_, xa), (pb, xb) = a[key], b[key]
        if pa_ != pb:
            problems.append(f"chunk {key}: start position {pb}, expected {pa_}")
        elif xa.shape != xb.shape:
            problems.append(f"chunk {key}: output shape {xb.shape}, expected {xa.shape}")
        else:
            worst = max(worst, float(np.max(np.abs(xa.astype(np.float64) - xb))))
    return problems, worst


def _warm_up(model: str, backend: str, data: np.ndarray) -> None:
    """Run the model once on ``data`` (a chunk of the demo's own) before the jobs, so that the
    kernels they call are compiled (or loaded from Numba's cache) and no job's tokens/s
    includes it."""
    from linstream.ops import load_model, resolve_backend

    if resolve_backend(backend) != "numba":
        return
    from linstream.ops.numba_cache import recording_compiles

    t0 = time.perf_counter()
    runtime = load_model(model)
    states: Any = runtime.initial_states(np.float64)  # either runtime's own kind
    with recording_compiles() as names:
        runtime.embed_chunk(data, states, backend=backend)
    how = f"{len(names)} function(s) compiled" if names else "loaded from Numba's cache"
    print(
        f"  kernels ready ({how}, {time.perf_counter() - t0:.1f} s, before the jobs: their "
        "tokens/s do not include it)"
    )


def run_demo(args: argparse.Namespace, beam_args: list[str]) -> int:
    workdir = args.workdir or tempfile.mkdtemp(prefix="linstream-demo-")
    os.makedirs(workdir, exist_ok=True)
    vocab, dim = model_input(args.model)
    n_chunks = -(-args.tokens // args.chunk_tokens)
    chunks = sample_chunks(
        args.sequences,
        args.tokens,
        args.chunk_tokens,
        args.seed,
        shuffle=True,
        duplicates=max(1, args.sequences * n_chunks // 10),
        vocab_size=vocab,
        input_dim=dim,
    )
    # Stop each sequence at a different chunk, so that the resume starts mid-sequence.
    rng = np.random.default_rng(args.seed)
    stop = {f"seq-{s:04d}": int(rng.integers(1, max(2, n_chunks))) for s in range(args.sequences)}
    part1 = [c for c in chunks if c.index < stop[c.seq_id]]
    part2 = [c for c in chunks if c.index >= stop[c.seq_id]]
    paths = {}
    for name, part in (("all", chunks), ("part1", part1), ("part2", part2)):
        paths[name] = os.path.join(workdir, "input", f"{name}.parquet")
        write_chunk_file(paths[name], part, dim)
    distinct = len({(c.seq_id, c.index) for c in chunks})
    print(
        f"linstream demo: {args.sequences} sequences x {args.tokens:,} tokens in chunks of "
        f"{args.chunk_tokens}: {distinct} chunks, written as {len(chunks)} rows (shuffled, "
        f"{len(chunks) - distinct} of them twice) in {workdir}"
    )
    _warm_up(args.model, args.backend, chunks[0].data)
    ckpt = os.path.join(workdir, "checkpoints")
    shutil.rmtree(ckpt, ignore_errors=True)
    runs: list[tuple[str, JobSummary]] = []

    def job(
        name: str, inp: str, checkpoint_dir: str | None = None, resume: bool = False
    ) -> dict[tuple[str, int], tuple[int, np.ndarray]]:
        out = os.path.join(workdir, "out", name)
        shutil.rmtree(out, ignore_errors=True)
        config = EmbedConfig(
            input=inp,
            output=out,
            model=args.model,
            backend=args.backend,
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            emit="tokens",
            checkpoint_every=4,
            max_buffered_chunks=64,
            progress_every=0,
        )
        summary = run_embed(config, beam_args, log=lambda line: print(f"  {line}"))
        runs.append((name, summary))
        print(f"  {name:<14} {summary.line()}")
        dead = read_dead_letters(out)
        if dead:
            print(f"  {name:<14} {len(dead)} dead letter(s), e.g. {dead[0]}")
        return read_results(out)

    low, high = min(stop.values()), max(stop.values())
    print(
        f"  part 1: each sequence's first {low} to {high} of its {n_chunks} chunks (where a "
        "stopped job would have left it), committed every 4 chunks"
    )
    r1 = job("part1", paths["part1"], checkpoint_dir=ckpt)
    print(_COUNTERS)
    print("  part 2: the rest of each sequence, with --resume: it continues from its last commit")
    r2 = job("part2-resume", paths["part2"], checkpoint_dir=ckpt, resume=True)
    print("  one job over every chunk, to compare with")
    full = job("uninterrupted", paths["all"])
    resumed = {**r1, **r2}
    problems, worst = compare_results(full, resumed)
    if set(r1) & set(r2):
        problems.append(f"{len(set(r1) & set(r2))} chunk(s) applied by both jobs")
    total_tokens = sum(s.tokens for _, s in runs[:2])
    total_wall = sum(s.wall_s for _, s in runs[:2])
    print(
        f"  part 1 + part 2: {total_tokens:,} tokens in {total_wall:.1f} s "
        f"({total_tokens / max(total_wall, 1e-9):,.0f} tokens/s, each job's start-up included, "
        "the kernels' compiling not)"
    )
    if problems or worst > 1e-5:
        print("resume check FAILED: " + "; ".join(problems or [f"max |diff| {worst:.3g}"]))
        return 1
    print(
        f"resume check passed: {len(full)} chunks, part 1 + resumed part 2 equal one "
        f"uninterrupted run (max |diff| {worst:.3g})"
    )
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
