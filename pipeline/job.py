"""The embed job: its options, `build_embed_pipeline(pipeline, args)`, and a local runner helper.

`build_embed_pipeline` only adds transforms to a pipeline, so deploy tooling can build the same
graph for Dataflow (or translate it with a dry run) that `linstream embed` runs locally.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from .core import EMIT_MODES, NAMESPACE
from .io import ReadChunks, WriteDeadLetters, WriteResults
from .transforms import EmbedSequences

__all__ = [
    "DEFAULT_LOCAL_RUNNER",
    "JobSummary",
    "add_embed_arguments",
    "build_embed_pipeline",
    "pipeline_options",
    "run_embed",
]

#: The local runner that needs no download (the default DirectRunner may fetch Prism).
DEFAULT_LOCAL_RUNNER = "FnApiRunner"


def add_embed_arguments(parser: argparse.ArgumentParser) -> None:
    """The embed job's own options; anything else is a Beam pipeline option."""
    parser.add_argument("--input", help="chunk Parquet file(s): a glob, or globs joined by ','")
    parser.add_argument("--output", required=True, help="directory for results and dead letters")
    parser.add_argument("--model", default="builtin:default", help="model spec or .safetensors")
    parser.add_argument("--checkpoint-dir", default=None, help="checkpoint store root")
    parser.add_argument(
        "--resume", action="store_true", help="continue sequences from --checkpoint-dir"
    )
    parser.add_argument("--emit", choices=EMIT_MODES, default="tokens")
    parser.add_argument("--backend", default="auto", choices=("auto", "numpy", "numba", "cupy"))
    parser.add_argument("--checkpoint-every", type=int, default=16, metavar="N")
    parser.add_argument(
        "--restore-fallback",
        action="store_true",
        help="when a sequence's newest checkpoint is corrupt, continue from the previous one "
        "(logged); without it that sequence's chunks go to the dead letters",
    )
    parser.add_argument("--max-buffered-chunks", type=int, default=64, metavar="N")
    parser.add_argument(
        "--idle-timeout", type=float, default=300.0, metavar="S", help="event-time seconds"
    )
    parser.add_argument("--state-dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--num-shards", type=int, default=0, help="result shards (0: runner's)")
    parser.add_argument(
        "--progress-every", type=float, default=10.0, metavar="S", help="0 turns progress off"
    )
    parser.add_argument(
        "--streaming",
        action="store_true",
        help="read an unbounded source (pipeline/streaming_sources.py; Pub/Sub, Kafka)",
    )
    parser.add_argument(
        "--window-seconds", type=float, default=60.0, help="output windows with --streaming"
    )
    if _has_streaming_sources():
        from . import streaming_sources

        streaming_sources.add_streaming_args(parser)


def _has_streaming_sources() -> bool:
    return importlib.util.find_spec("linstream.pipeline.streaming_sources") is not None


def pipeline_options(beam_args: list[str], *, streaming: bool = False) -> PipelineOptions:
    """Beam options from pass-through args, with the local runner pinned unless one is named."""
    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append(f"--runner={DEFAULT_LOCAL_RUNNER}")
    if streaming and "--streaming" not in args:
        args.append("--streaming")
    return PipelineOptions(args)


def _get(args: Any, name: str, default: Any = None) -> Any:
    if isinstance(args, dict):
        return args.get(name, default)
    return getattr(args, name, default)


def build_embed_pipeline(pipeline: beam.Pipeline, args: Any) -> tuple[Any, Any]:
    """Add read → EmbedSequences → write to `pipeline`; returns (results, dead_letters).

    `args` is the namespace (or a dict) of `add_embed_arguments`: input, output, model,
    checkpoint_dir, resume, emit, backend, checkpoint_every, max_buffered_chunks, ...
    With `streaming`, chunks come from `linstream.pipeline.streaming_sources.read_stream_chunks`.
    """
    emit = _get(args, "emit", "tokens")
    progress = _get(args, "progress_every", 10.0)
    transform = EmbedSequences(
        _get(args, "model", "builtin:default"),
        backend=_get(args, "backend", "auto"),
        checkpoint_dir=_get(args, "checkpoint_dir"),
        checkpoint_every=_get(args, "checkpoint_every", 16),
        resume=bool(_get(args, "resume", False)),
        max_buffered_chunks=_get(args, "max_buffered_chunks", 64),
        idle_timeout=_get(args, "idle_timeout", 300.0),
        state_dtype=_get(args, "state_dtype", "float64"),
        emit=emit,
        progress_every_s=progress if progress else None,
        restore_fallback=bool(_get(args, "restore_fallback", False)),
    )
    width = int(transform._dofn.step.model.config.d_model)  # type: ignore[attr-defined]  # EmbedStep
    output = _get(args, "output")
    if _get(args, "streaming", False):
        if not _has_streaming_sources():
            msg = (
                "--streaming needs linstream.pipeline.streaming_sources (read_stream_chunks), "
                "which this installation does not have"
            )
            raise RuntimeError(msg)
        from . import streaming_sources

        chunks, source_dead = streaming_sources.read_stream_chunks(
            pipeline, args, with_dead_letters=True
        )
    else:
        if not _get(args, "input"):
            msg = "--input is required (or --streaming with a stream source)"
            raise ValueError(msg)
        chunks = pipeline | "ReadChunks" >> ReadChunks(_get(args, "input"))
        source_dead = None
    results, dead = chunks | "Embed" >> transform.with_exception_handling()
    if source_dead is not None:
        dead = (dead, source_dead) | "AllDeadLetters" >> beam.Flatten()
    if _get(args, "streaming", False):
        from apache_beam.transforms.window import FixedWindows

        window = float(_get(args, "window_seconds", 60.0))
        results = results | "WindowResults" >> beam.WindowInto(FixedWindows(window))
        dead = dead | "WindowDeadLetters" >> beam.WindowInto(FixedWindows(window))
    results | "WriteResults" >> WriteResults(output, width, emit, _get(args, "num_shards", 0))
    dead | "WriteDeadLetters" >> WriteDeadLetters(output, topic=_get(args, "dead_letter_topic"))
    return results, dead


@dataclass
class JobSummary:
    """What one local run did: wall time and the `linstream` counters."""

    wall_s: float
    counters: dict[str, int] = field(default_factory=dict)
    kernel_time_s: float = 0.0

    @property
    def tokens(self) -> int:
        return self.counters.get("tokens", 0)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        c = self.counters
        return (
            f"{c.get('chunks', 0):,} chunks, {self.tokens:,} tokens in {self.wall_s:.1f} s "
            f"({self.tokens_per_s:,.0f} tokens/s); duplicates {c.get('duplicates', 0)}, "
            f"buffered {c.get('buffered', 0)}, gaps {c.get('gaps', 0)}, "
            f"dead letters {c.get('dead_letters', 0)}, commits {c.get('commits', 0)}, "
            f"restores {c.get('restores', 0)}"
        )


def _query_metrics(result: Any) -> tuple[dict[str, int], float]:
    counters: dict[str, int] = {}
    kernel_s = 0.0
    try:
        res = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except (NotImplementedError, AttributeError):  # runners without metrics
        return counters, kernel_s
    for c in res.get("counters", []):
        value = c.committed if c.committed is not None else c.attempted
        counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + int(value or 0)
    for d in res.get("distributions", []):
        if d.key.metric.name == "kernel_time_us":
            value = d.committed if d.committed is not None else d.attempted
            kernel_s += (value.sum if value else 0) / 1e6
    return counters, kernel_s


def _remove_empty_temp_dirs(output: str | None) -> None:
    """fileio leaves its emptied `.temp*` folder behind on local disk; tidy it."""
    if not output or not os.path.isdir(output):
        return
    for name in os.listdir(output):
        path = os.path.join(output, name)
        if name.startswith(".temp") and os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)


def run_embed(args: Any, beam_args: list[str] | None = None) -> JobSummary:
    """Build and run the embed job to completion (local runners); return its summary."""
    opts = pipeline_options(beam_args or [], streaming=bool(_get(args, "streaming", False)))
    pipeline = beam.Pipeline(options=opts)
    build_embed_pipeline(pipeline, args)
    t0 = time.perf_counter()
    result = pipeline.run()
    result.wait_until_finish()
    wall = time.perf_counter() - t0
    _remove_empty_temp_dirs(_get(args, "output"))
    counters, kernel_s = _query_metrics(result)
    return JobSummary(wall, counters, kernel_s)
