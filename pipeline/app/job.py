"""The embed job: its options, `build_embed_pipeline(pipeline, args)`, and a local runner helper.

`build_embed_pipeline` only adds transforms to a pipeline, so deploy tooling can build the same
graph for Dataflow (or translate it with a dry run) that `linstream embed` runs locally.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from linstream.pipeline.errors import UsageError
from linstream.pipeline.io import WriteDeadLetters, WriteResults
from linstream.pipeline.io.text_input import read_input
from linstream.pipeline.stage.dofn import NAMESPACE
from linstream.pipeline.stage.transforms import EmbedSequences

from .local_runner import state_cache_for
from .options import add_embed_arguments as add_flags

__all__ = [
    "DEFAULT_LOCAL_RUNNER",
    "JobFailed",
    "JobSummary",
    "add_embed_arguments",
    "build_embed_pipeline",
    "check_embed_args",
    "dead_letter_verdict",
    "pipeline_options",
    "run_embed",
]

#: The local runner that needs no download (the default DirectRunner may fetch Prism).
DEFAULT_LOCAL_RUNNER = "FnApiRunner"


def add_embed_arguments(parser: argparse.ArgumentParser) -> None:
    """The embed job's own options (`linstream.pipeline.app.options.EMBED_FLAGS`, both spellings of
    each) and the streaming sources'; anything else is a Beam pipeline option."""
    add_flags(parser)
    if _has_streaming_sources():
        from linstream.pipeline.io import streaming as streaming_sources

        streaming_sources.add_streaming_args(parser)


def _has_streaming_sources() -> bool:
    return importlib.util.find_spec("linstream.pipeline.io.streaming") is not None


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


def _set(args: Any, name: str, value: Any) -> None:
    if isinstance(args, dict):
        args[name] = value
    else:
        setattr(args, name, value)


def build_embed_pipeline(pipeline: beam.Pipeline, args: Any) -> tuple[Any, Any]:
    """Add read → EmbedSequences → write to `pipeline`; returns (results, dead_letters).

    `args` is the namespace (or a dict) of `add_embed_arguments`: input, output, model,
    checkpoint_dir, resume, emit, backend, checkpoint_every, max_buffered_chunks, ...
    With `streaming`, chunks come from `linstream.pipeline.io.streaming.read_stream_chunks`.
    """
    emit = _get(args, "emit", "mean")
    progress = _get(args, "progress_every", 10.0)
    output = _get(args, "output")
    # With a checkpoint store the stage writes each span of results as part of the commit that
    # covers it (exactly once across crashes); without one, Beam's file sink writes them.
    commit_outputs = bool(_get(args, "checkpoint_dir")) and output is not None
    transform = EmbedSequences(
        _get(args, "model", "builtin:default"),
        backend=_get(args, "backend", "auto"),
        checkpoint_dir=_get(args, "checkpoint_dir"),
        checkpoint_every=_get(args, "checkpoint_every", 16),
        resume=bool(_get(args, "resume", False)),
        max_buffered_chunks=_get(args, "max_buffered_chunks", None),
        idle_timeout=_get(args, "idle_timeout", 300.0),
        state_dtype=_get(args, "state_dtype", "float64"),
        emit=emit,
        progress_every_s=progress if progress else None,
        restore_fallback=bool(_get(args, "restore_fallback", False)),
        output_dir=output if commit_outputs else None,
        total_tokens=_get(args, "total_tokens"),
    )
    width = int(transform._dofn.step.model.config.d_model)  # type: ignore[attr-defined]  # EmbedStep
    if _get(args, "streaming", False):
        if not _has_streaming_sources():
            msg = (
                "--streaming needs linstream.pipeline.io.streaming (read_stream_chunks), "
                "which this installation does not have"
            )
            raise RuntimeError(msg)
        from linstream.pipeline.io import streaming as streaming_sources

        chunks, source_dead = streaming_sources.read_stream_chunks(
            pipeline, args, with_dead_letters=True
        )
    else:
        chunks, source_dead = read_input(pipeline, args)
    results, dead = chunks | "Embed" >> transform.with_exception_handling()
    if source_dead is not None:
        dead = (dead, source_dead) | "AllDeadLetters" >> beam.Flatten()
    if _get(args, "streaming", False):
        from apache_beam.transforms.window import FixedWindows

        window = float(_get(args, "window_seconds", 60.0))
        results = results | "WindowResults" >> beam.WindowInto(FixedWindows(window))
        dead = dead | "WindowDeadLetters" >> beam.WindowInto(FixedWindows(window))
    if not commit_outputs:
        results | "WriteResults" >> WriteResults(output, width, emit, _get(args, "num_shards", 0))
    dead | "WriteDeadLetters" >> WriteDeadLetters(output, topic=_get(args, "dead_letter_topic"))
    return results, dead


class JobFailed(RuntimeError):
    """The Beam run itself failed (exit status 1); the runner's error is the cause."""


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

    @property
    def dead_letters(self) -> int:
        return self.counters.get("dead_letters", 0)

    def dead_letter_reasons(self) -> dict[str, int]:
        """{reason: count} from the `dead_letters.<reason>` counters, largest first."""
        prefix = "dead_letters."
        found = {k[len(prefix) :]: v for k, v in self.counters.items() if k.startswith(prefix)}
        return dict(sorted(((k, v) for k, v in found.items() if v), key=lambda kv: (-kv[1], kv[0])))

    def dead_letter_line(self) -> str:
        """`dead letters: 3 (bad_tokens 2, restore_failed 1)` or `dead letters: none`."""
        if not self.dead_letters:
            return "dead letters: none"
        reasons = ", ".join(f"{k} {v:,}" for k, v in self.dead_letter_reasons().items())
        return f"dead letters: {self.dead_letters:,}" + (f" ({reasons})" if reasons else "")

    def line(self) -> str:
        c = self.counters
        return (
            f"{c.get('chunks', 0):,} chunks, {self.tokens:,} tokens in {self.wall_s:.1f} s "
            f"({self.tokens_per_s:,.0f} tokens/s); duplicates {c.get('duplicates', 0)}, "
            f"buffered {c.get('buffered', 0)}, gaps {c.get('gaps', 0)}, "
            f"dead letters {c.get('dead_letters', 0)}, commits {c.get('commits', 0)}, "
            f"restores {c.get('restores', 0)}"
        )


def dead_letter_verdict(summary: JobSummary, limit: Any = None) -> str | None:
    """Why the job must exit 3 (a sentence), or None.

    The rule: any `restore_failed` dead letter (a sequence's checkpoint could not be read, so
    none of its chunks was embedded); a job whose chunks all went to the dead letters; or more
    dead letters than `--max-dead-letters` (N, or P% of applied chunks + dead letters).
    """
    if isinstance(limit, str):
        from .options import parse_dead_letter_limit

        limit = parse_dead_letter_limit(limit)
    dead, chunks = summary.dead_letters, summary.counters.get("chunks", 0)
    restore_failed = summary.counters.get("dead_letters.restore_failed", 0)
    if restore_failed:
        return (
            f"{restore_failed:,} chunk(s) went to the dead letters as restore_failed: their "
            "sequences' checkpoints could not be read (see `linstream checkpoint verify`; "
            "--restore-fallback continues from an older commit)"
        )
    if dead and not chunks:
        return f"all {dead:,} input chunk(s) or row(s) went to the dead letters; none was embedded"
    if limit is not None and limit.exceeded(dead, chunks):
        return f"{dead:,} dead letter(s) exceed --max-dead-letters {limit}"
    return None


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
    for dirpath in (output, os.path.join(output, "results"), os.path.join(output, "dead_letters")):
        if not os.path.isdir(dirpath):
            continue
        for name in os.listdir(dirpath):
            path = os.path.join(dirpath, name)
            if name.startswith(".temp") and os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)


def check_embed_args(args: Any, beam_args: list[str]) -> None:
    """Usage errors found before anything runs (UsageError, exit status 2)."""
    if _get(args, "resume", False) and not _get(args, "checkpoint_dir"):
        msg = "--resume needs --checkpoint-dir (the checkpoint store to continue from)"
        raise UsageError(msg)
    if not _get(args, "output"):
        msg = "--output is required"
        raise UsageError(msg)
    if _get(args, "backend", "auto") == "cupy":
        from linstream.ops.backend import cupy_unavailable_reason

        reason = cupy_unavailable_reason()
        if reason:
            msg = f"--backend cupy: no usable GPU here ({reason}); use --backend auto or numba"
            raise UsageError(msg)
    runner = next(
        (a.split("=", 1)[1] for a in beam_args if a.startswith("--runner=")),
        None,
    )
    if runner is None and "--runner" in beam_args:
        i = beam_args.index("--runner")
        runner = beam_args[i + 1] if i + 1 < len(beam_args) else None
    if runner is not None and not runner:
        msg = "--runner needs a value (e.g. FnApiRunner, DataflowRunner)"
        raise UsageError(msg)


def numba_cache_is_cold() -> bool:
    """Whether the Numba kernels will compile on first use: their on-disk cache
    (``NUMBA_CACHE_DIR``, or beside the package) holds no kernel compiled for this CPU (it is
    empty, or was filled on another CPU model, or before the package's files changed)."""
    from linstream.ops.numba_cache import holds_this_cpu

    return not holds_this_cpu()


# the figure: `linstream embed` and `linstream warmup` on an empty cache, 2 loaded vCPUs
# (docs/benchmarks.md): 5-20 s of compiling for builtin:default, more at long chunks
_COMPILING = (
    "compiling the Numba kernels for this machine (about 10-30 s, once: later runs load them "
    "from the cache; `linstream warmup --model M` compiles them ahead)"
)


def _announce_compile(args: Any, log: Any) -> contextlib.AbstractContextManager[None]:
    """Says once, in one line, that the kernels compile: now, when the cache holds nothing for
    this CPU, else at the first compile the job's own process sees (a cache warmed for another
    model or state dtype).  Returns the context the job runs in."""
    from linstream.ops import resolve_backend

    try:
        backend = resolve_backend(_get(args, "backend", "auto"))
    except Exception:  # reported where the job uses it
        return contextlib.nullcontext()
    if backend != "numba":
        return contextlib.nullcontext()
    if numba_cache_is_cold():
        log(_COMPILING)
        return contextlib.nullcontext()
    from linstream.ops.numba_cache import on_first_compile

    return on_first_compile(lambda _name: log(_COMPILING))


def run_embed(args: Any, beam_args: list[str] | None = None, *, log: Any = None) -> JobSummary:
    """Build and run the embed job to completion (local runners); return its summary.

    Raises UsageError for what is wrong in `args` (before anything runs) and JobFailed when
    the run itself fails.  `log(line)` receives the one-line notes (stale temporaries removed,
    kernels compiling); default: the `linstream.pipeline.app.job` logger.
    """
    import logging

    say = log or logging.getLogger(__name__).info
    beam_args = list(beam_args or [])
    check_embed_args(args, beam_args)
    from .stopping import remove_stale_temporaries

    output = _get(args, "output")
    stale = remove_stale_temporaries(output)
    if stale:
        say(f"removed {len(stale)} stale temporary folder(s) left under {output} by a stopped job")
    if _get(args, "progress_every", 0) and not _get(args, "streaming", False):
        from linstream.pipeline.io.text_input import input_token_total

        _set(args, "total_tokens", input_token_total(args))  # for the progress line's ETA
    opts = pipeline_options(beam_args, streaming=bool(_get(args, "streaming", False)))
    pipeline = beam.Pipeline(options=opts)
    build_embed_pipeline(pipeline, args)
    runner = str(opts.get_all_options().get("runner") or "")
    announce: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if runner in ("", DEFAULT_LOCAL_RUNNER, "DirectRunner", "BundleBasedDirectRunner"):
        announce = _announce_compile(args, say)
    t0 = time.perf_counter()
    try:
        # as an SDK harness sizes it (FnApiRunner: 100 MB)
        with announce, state_cache_for(opts):
            result = pipeline.run()
            result.wait_until_finish()
    except Exception as ex:
        raise JobFailed(str(ex)) from ex
    wall = time.perf_counter() - t0
    _remove_empty_temp_dirs(output)
    counters, kernel_s = _query_metrics(result)
    return JobSummary(wall, counters, kernel_s)
