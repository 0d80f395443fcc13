"""The embed job: `build_embed_pipeline(pipeline, config)`, and running it on a local runner.

`build_embed_pipeline` only adds transforms to a pipeline, so deploy tooling can build the same
graph for Dataflow (or translate it with a dry run) that `linstream embed` runs locally.  Both
take one `EmbedConfig` (options.py), built once from the command line, a `PipelineOptions` view
or a dict.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from linstream.pipeline.errors import UsageError
from linstream.pipeline.io import WriteDeadLetters, WriteResults
from linstream.pipeline.io.output_files import settle_dead_letters
from linstream.pipeline.io.text_input import read_input
from linstream.pipeline.stage.counters import NAMESPACE
from linstream.pipeline.stage.transforms import EmbedSequences

from .flag_values import DeadLetterLimit, parse_dead_letter_limit
from .local_runner import state_cache_for
from .options import EmbedConfig
from .options import add_embed_arguments as add_flags
from .second_run import check_checkpoint_dir, prepare_output

__all__ = [
    "DEFAULT_LOCAL_RUNNER",
    "LOCAL_RUNNERS",
    "JobFailed",
    "JobSummary",
    "add_embed_arguments",
    "build_embed_pipeline",
    "check_embed_args",
    "dead_letter_verdict",
    "embed_transform",
    "is_local_runner",
    "pipeline_options",
    "run_embed",
    "runner_of",
]

#: The local runner that needs no download (the default DirectRunner may fetch Prism).
DEFAULT_LOCAL_RUNNER = "FnApiRunner"
#: Runners whose workers run on this machine (a check of this machine's GPU holds for them).
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "PrismRunner")


def runner_of(beam_args: list[str]) -> str:
    """The `--runner` the Beam arguments name (the last one given), else the local default."""
    runner = DEFAULT_LOCAL_RUNNER
    for i, arg in enumerate(beam_args):
        if arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
        elif arg == "--runner" and i + 1 < len(beam_args):
            runner = beam_args[i + 1]
    return runner


def is_local_runner(runner: str) -> bool:
    """Whether `runner` (a name or a dotted path) runs its workers on this machine."""
    return runner.rsplit(".", 1)[-1] in LOCAL_RUNNERS


def add_embed_arguments(parser: argparse.ArgumentParser) -> None:
    """The embed job's own options (`linstream.pipeline.app.options.EMBED_FLAGS`, both spellings of
    each) and the streaming sources'; anything else is a Beam pipeline option."""
    from linstream.pipeline.io.streaming import add_streaming_args

    add_flags(parser)
    add_streaming_args(parser)


def pipeline_options(beam_args: list[str], *, streaming: bool = False) -> PipelineOptions:
    """Beam options from pass-through args, with the local runner pinned unless one is named."""
    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append(f"--runner={DEFAULT_LOCAL_RUNNER}")
    if streaming and "--streaming" not in args:
        args.append("--streaming")
    return PipelineOptions(args)


def embed_transform(config: EmbedConfig, *, total_tokens: int | None = None) -> EmbedSequences:
    """The job's `EmbedSequences` (its model loaded here: ``.model`` names the output width and
    the fingerprint); ``total_tokens`` (what the job has to do, when counted before the run)
    gives the progress line an ETA."""
    return EmbedSequences(
        config.model,
        backend=config.backend,
        state_dtype=config.state_dtype,
        layer=config.layer,
        compute_dtype=config.compute_dtype,
        stage=config.stage_config(total_tokens=total_tokens),
    )


def build_embed_pipeline(
    pipeline: beam.Pipeline,
    config: EmbedConfig,
    *,
    total_tokens: int | None = None,
    transform: EmbedSequences | None = None,
) -> tuple[Any, Any]:
    """Add read → EmbedSequences → write to `pipeline`; returns (results, dead_letters).

    With ``config.streaming``, chunks come from the streaming source (`config.stream`);
    ``total_tokens`` (the input's, when counted before the run) gives the progress line an ETA;
    ``transform``: the job's `embed_transform`, when the caller made it already.
    """
    output = config.output
    if not output:
        msg = "--output is required"
        raise UsageError(msg)
    if transform is None:
        transform = embed_transform(config, total_tokens=total_tokens)
    width = int(transform.model.config.d_model)
    if config.streaming:
        from linstream.pipeline.io.streaming import read_stream_chunks

        chunks, source_dead = read_stream_chunks(pipeline, config.stream, with_dead_letters=True)
    else:
        chunks, source_dead = read_input(pipeline, config.input_config())
    results, dead = chunks | "Embed" >> transform.with_exception_handling()
    if source_dead is not None:
        dead = (dead, source_dead) | "AllDeadLetters" >> beam.Flatten()
    if config.streaming:
        from apache_beam.transforms.window import FixedWindows

        window = float(config.window_seconds)
        results = results | "WindowResults" >> beam.WindowInto(FixedWindows(window))
        dead = dead | "WindowDeadLetters" >> beam.WindowInto(FixedWindows(window))
    if not config.commits_outputs:
        results | "WriteResults" >> WriteResults(output, width, config.emit, config.num_shards)
    dead | "WriteDeadLetters" >> WriteDeadLetters(output, topic=config.stream.dead_letter_topic)
    return results, dead


class JobFailed(RuntimeError):
    """The Beam run itself failed (exit status 1); the runner's error is the cause."""


@dataclass
class JobSummary:
    """What one local run did: wall time and the `linstream` counters."""

    wall_s: float
    counters: dict[str, int] = field(default_factory=dict)
    kernel_time_s: float = 0.0
    #: rows of the result files the job added under ``<output>/results/`` (None: not counted)
    rows_written: int | None = None

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


def dead_letter_verdict(
    summary: JobSummary, limit: DeadLetterLimit | str | None = None
) -> str | None:
    """Why the job must exit 3 (a sentence), or None.

    The rule: any `restore_failed` dead letter (a sequence's checkpoint could not be read, so
    none of its chunks was embedded); a job whose chunks all went to the dead letters (none
    applied, none skipped as applied before: a resumed job with nothing left to do is fine); or
    more dead letters than `--max-dead-letters` (N, or P% of the chunks the job met: applied,
    skipped as applied before, and dead letters).
    """
    if isinstance(limit, str):
        limit = parse_dead_letter_limit(limit)
    c = summary.counters
    dead = summary.dead_letters
    # A chunk skipped as already applied (a resume, a resent chunk) is a chunk done, not dead.
    chunks = c.get("chunks", 0) + c.get("duplicates", 0) + c.get("duplicates_unchecked", 0)
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


def check_embed_args(config: EmbedConfig, beam_args: list[str]) -> None:
    """Usage errors found before anything runs (UsageError, exit status 2)."""
    if config.resume and not config.checkpoint_dir:
        msg = "--resume needs --checkpoint-dir (the checkpoint store to continue from)"
        raise UsageError(msg)
    if not config.output:
        msg = "--output is required"
        raise UsageError(msg)
    if (beam_args and beam_args[-1] == "--runner") or "--runner=" in beam_args:
        msg = "--runner needs a value (e.g. FnApiRunner, DataflowRunner)"
        raise UsageError(msg)
    # A remote runner's workers have their own GPUs: they check theirs when the stage starts
    # (EmbedStep.setup refuses a backend that cannot run there); only a local run checks here.
    if config.backend == "cupy" and is_local_runner(runner_of(beam_args)):
        from linstream.ops.backend import cupy_unavailable_reason

        reason = cupy_unavailable_reason()
        if reason:
            msg = f"--backend cupy: no usable GPU here ({reason}); use --backend auto or numba"
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


def _announce_compile(config: EmbedConfig, log: Any) -> contextlib.AbstractContextManager[None]:
    """Says once, in one line, that the kernels compile: now, when the cache holds nothing for
    this CPU, else at the first compile the job's own process sees (a cache warmed for another
    model or state dtype, or any cache for a checkpoint folder's model).  Returns the context
    the job runs in."""
    from linstream.ops import resolve_backend

    try:
        backend = resolve_backend(config.backend)
    except Exception:  # reported where the job uses it
        return contextlib.nullcontext()
    if backend != "numba":
        return contextlib.nullcontext()
    from linstream.ops.model.runtime import is_model_folder

    # the cold-cache probe is a kernel of the built-in model, which a checkpoint folder's model
    # never calls (a cache warmed for the folder holds none): for a folder, the first compile says
    if not is_model_folder(config.model) and numba_cache_is_cold():
        log(_COMPILING)
        return contextlib.nullcontext()
    from linstream.ops.numba_cache import on_first_compile

    return on_first_compile(lambda _name: log(_COMPILING))


def _cancelled_on_stop(
    opts: PipelineOptions, runner: str, result: Any
) -> contextlib.AbstractContextManager[Any]:
    """A job handed to a job server (PortableRunner) with LOOPBACK workers cannot go on once this
    process stops (its workers are here): a stop cancels it on the runner too, where it would
    otherwise fail and be restarted.  Other jobs are left to their runner (a cluster's workers
    carry on without this process; a runner this process started stops with it)."""
    from apache_beam.options.pipeline_options import PortableOptions

    from .stopping import on_stop

    env = str(opts.view_as(PortableOptions).environment_type or "").upper()
    if runner.rsplit(".", 1)[-1] != "PortableRunner" or env != "LOOPBACK":
        return contextlib.nullcontext()
    return on_stop(result.cancel)


def run_embed(
    config: EmbedConfig, beam_args: list[str] | None = None, *, log: Any = None
) -> JobSummary:
    """Build and run the embed job to completion (local runners); return its summary.

    Raises UsageError for what is wrong in ``config`` (before anything runs) and JobFailed when
    the run itself fails.  `log(line)` receives the one-line notes (stale temporaries removed,
    kernels compiling); default: the `linstream.pipeline.app.job` logger.
    """
    import logging

    say = log or logging.getLogger(__name__).info
    beam_args = list(beam_args or [])
    check_embed_args(config, beam_args)
    check_checkpoint_dir(config)
    from .stopping import remove_stale_temporaries

    total = None
    if config.progress_every and not config.streaming:
        from .work_left import tokens_to_do

        total = tokens_to_do(config)  # the progress line's 100% (a resume: what is left)
    opts = pipeline_options(beam_args, streaming=config.streaming)
    pipeline = beam.Pipeline(options=opts)
    transform = embed_transform(config, total_tokens=total)
    build_embed_pipeline(pipeline, config, transform=transform)  # checks the input too
    output = str(config.output)
    stale = remove_stale_temporaries(output)
    if stale:
        say(f"removed {len(stale)} stale temporary folder(s) left under {output} by a stopped job")
    plan = prepare_output(config, transform.model)  # the last check; overwrite deletes here
    products = getattr(getattr(transform.model, "load_report", None), "products", "")
    if products:  # the bfloat16 mode: how its products run on this CPU
        say(f"compute dtype {config.compute_dtype}: {products}")
    runner = str(opts.get_all_options().get("runner") or "")
    announce: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if runner in ("", DEFAULT_LOCAL_RUNNER, "DirectRunner", "BundleBasedDirectRunner"):
        announce = _announce_compile(config, say)
    t0 = time.perf_counter()
    try:
        # as an SDK harness sizes it (FnApiRunner: 100 MB)
        with announce, state_cache_for(opts):
            result = pipeline.run()
            with _cancelled_on_stop(opts, runner, result):
                result.wait_until_finish()
    except Exception as ex:
        raise JobFailed(str(ex)) from ex
    wall = time.perf_counter() - t0
    _remove_empty_temp_dirs(output)
    if output and not config.streaming:  # one record per sequence, chunk and reason
        try:
            settle_dead_letters(output)
        except (OSError, ValueError) as ex:
            say(
                f"the dead letters under {output} could not be settled "
                f"(a record may be there twice): {ex}"
            )
    counters, kernel_s = _query_metrics(result)
    return JobSummary(wall, counters, kernel_s, plan.rows_written())
