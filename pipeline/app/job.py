"""The embed job: `build_embed_pipeline(pipeline, config)`, and running it on a local runner.

`build_embed_pipeline` only adds transforms to a pipeline, so deploy tooling can build the same
graph for Dataflow (or translate it with a dry run) that `linstream embed` runs locally.  Both
take one `EmbedConfig` (options.py), built once from the command line, a `PipelineOptions` view
or a dict.  `run_embed` checks everything first (`launch.prepare_launch`, no Beam), then builds
the pipeline from what the checks found, and runs it:

    cli._cmd_embed -> run_embed -> prepare_launch (checks; the store opened once for them)
                                -> build_embed_pipeline -> EmbedSequences -> SequenceStage
                                -> the run, the dead letters settled, the summary

Beam is imported by the functions that use it, not by this module: the command line reads its
flags and makes its checks before Beam's import (about two seconds) is paid.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

from linstream.pipeline.errors import UsageError

from .job_summary import JobSummary, dead_letter_verdict
from .launch import Launch, check_flags, prepare_launch
from .options import EmbedConfig
from .options import add_embed_arguments as add_flags
from .runners import (
    DEFAULT_LOCAL_RUNNER,
    LOCAL_RUNNERS,
    is_local_runner,
    prism_args,
    prism_hint,
    runner_of,
)

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions
    from linstream.pipeline.io.input_plan import InputPlan
    from linstream.pipeline.stage.transforms import EmbedSequences

__all__ = [
    "DEFAULT_LOCAL_RUNNER",
    "LOCAL_RUNNERS",
    "JobFailed",
    "JobSummary",
    "add_embed_arguments",
    "build_embed_pipeline",
    "dead_letter_verdict",
    "embed_transform",
    "is_local_runner",
    "pipeline_options",
    "run_embed",
    "runner_of",
]


def add_embed_arguments(parser: argparse.ArgumentParser) -> None:
    """The embed job's own options (`linstream.pipeline.app.options.EMBED_FLAGS`, both spellings of
    each) and the streaming sources'; anything else is a Beam pipeline option."""
    from linstream.pipeline.io.reader_config import add_streaming_args

    add_flags(parser)
    add_streaming_args(parser)


def pipeline_options(beam_args: list[str], *, streaming: bool = False) -> PipelineOptions:
    """Beam options from pass-through args, with the local runner pinned unless one is named
    (and Prism pointed at the binary the project fetched: `runners.prism_args`)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args = prism_args(list(beam_args))
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append(f"--runner={DEFAULT_LOCAL_RUNNER}")
    if streaming and "--streaming" not in args:
        args.append("--streaming")
    return PipelineOptions(args)


def embed_transform(
    config: EmbedConfig, *, total_tokens: int | None = None, model: Any = None
) -> EmbedSequences:
    """The job's `EmbedSequences` (``model``: the model already loaded from ``config.model``,
    else it is loaded here: ``.model`` names the output width and the fingerprint);
    ``total_tokens`` (what the job has to do, when counted before the run) gives the progress
    line an ETA."""
    from linstream.pipeline.stage.transforms import EmbedSequences

    return EmbedSequences(
        config.model,
        backend=config.backend,
        state_dtype=config.state_dtype,
        layer=config.layer,
        compute_dtype=config.compute_dtype,
        loaded=model,
        stage=config.stage_config(total_tokens=total_tokens),
    )


def build_embed_pipeline(
    pipeline: Any,
    config: EmbedConfig,
    *,
    total_tokens: int | None = None,
    transform: EmbedSequences | None = None,
    inputs: InputPlan | None = None,
) -> tuple[Any, Any]:
    """Add read → EmbedSequences → write to `pipeline`; returns (results, dead_letters).

    With ``config.streaming``, chunks come from the streaming source (`config.stream`);
    ``total_tokens`` (the input's, when counted before the run) gives the progress line an ETA;
    ``transform`` and ``inputs``: the job's `embed_transform` and input plan, when the caller
    (`run_embed`) made them already; else the flags are checked and they are made here.
    """
    import apache_beam as beam
    from linstream.pipeline.io.output_writers import WriteDeadLetters, WriteResults
    from linstream.pipeline.io.text_input import read_input

    if transform is None:
        check_flags(config)
        transform = embed_transform(config, total_tokens=total_tokens)
    output = str(config.output)
    width = int(transform.model.config.d_model)
    if config.streaming:
        from linstream.pipeline.io.streaming import read_stream_chunks

        chunks, source_dead = read_stream_chunks(pipeline, config.stream, with_dead_letters=True)
    else:
        chunks, source_dead = read_input(pipeline, inputs or config.input_config())
    results, dead = chunks | "Embed" >> transform.with_exception_handling()
    if source_dead is not None:
        dead = (dead, source_dead) | "AllDeadLetters" >> beam.Flatten()
    if config.streaming:
        from apache_beam.transforms.window import FixedWindows

        window = float(config.window_seconds)
        results = results | "WindowResults" >> beam.WindowInto(FixedWindows(window))
        dead = dead | "WindowDeadLetters" >> beam.WindowInto(FixedWindows(window))
    if not config.commits_outputs:
        writer = WriteResults(
            output, width, config.emit, config.num_shards, compute_dtype=str(config.compute_dtype)
        )
        results | "WriteResults" >> writer
    dead | "WriteDeadLetters" >> WriteDeadLetters(output, topic=config.stream.dead_letter_topic)
    return results, dead


class JobFailed(RuntimeError):
    """The Beam run itself failed (exit status 1); the runner's error is the cause."""


def _query_metrics(result: Any) -> tuple[dict[str, int], float]:
    counters: dict[str, int] = {}
    kernel_s = 0.0
    try:
        from apache_beam.metrics.metric import MetricsFilter
        from linstream.pipeline.stage.counters import NAMESPACE

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


def _prism_missing(runner: str, ex: BaseException) -> UsageError | None:
    """A Prism run that failed because Beam could not fetch the Prism binary: one line saying
    how to get one (else None)."""
    if runner.rsplit(".", 1)[-1] != "PrismRunner":
        return None
    text = str(ex)
    if "prism binary" not in text.lower():
        return None
    line = next((ln for ln in text.splitlines() if "prism binary" in ln.lower()), text)
    return UsageError(prism_hint(line.strip()))


def run_embed(
    config: EmbedConfig,
    beam_args: list[str] | None = None,
    *,
    log: Any = None,
    launch: Launch | None = None,
) -> JobSummary:
    """Check, build and run the embed job to completion (local runners); return its summary.

    Raises UsageError for what is wrong in ``config`` (before anything is created; ``launch``:
    the checks' `prepare_launch`, when the caller made it) and JobFailed when the run itself
    fails.  `log(line)` receives the one-line notes (stale temporaries removed, kernels
    compiling); default: the `linstream.pipeline.app.job` logger.
    """
    import logging

    say = log or logging.getLogger(__name__).info
    beam_args = list(beam_args or [])
    if launch is None:
        launch = prepare_launch(config, beam_args)
    import apache_beam as beam
    from linstream.pipeline.io.output_files import settle_dead_letters

    from .local_runner import state_cache_for
    from .stopping import hold_stages, on_stop, remove_stale_temporaries

    opts = pipeline_options(beam_args, streaming=config.streaming)
    pipeline = beam.Pipeline(options=opts)
    transform = embed_transform(config, total_tokens=launch.total_tokens, model=launch.model)
    build_embed_pipeline(pipeline, config, transform=transform, inputs=launch.inputs)
    output = str(config.output)
    stale = remove_stale_temporaries(output)
    if stale:
        say(f"removed {len(stale)} stale temporary folder(s) left under {output} by a stopped job")
    launch.output.apply()  # overwrite deletes here; the folder's record is written
    products = getattr(getattr(transform.model, "load_report", None), "products", "")
    if products:  # a checkpoint folder's model: how its products run on this CPU
        say(f"compute dtype {config.compute_dtype}: {products}")
    runner = str(opts.get_all_options().get("runner") or "")
    announce: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if is_local_runner(runner or DEFAULT_LOCAL_RUNNER):
        announce = _announce_compile(config, say)
    # A stop holds this process's stages first, then publishes what their commits cover.
    held = on_stop(hold_stages) if is_local_runner(runner or DEFAULT_LOCAL_RUNNER) else None
    t0 = time.perf_counter()
    try:
        # as an SDK harness sizes it (FnApiRunner: 100 MB)
        with announce, state_cache_for(opts), held or contextlib.nullcontext():
            result = pipeline.run()
            with _cancelled_on_stop(opts, runner, result):
                result.wait_until_finish()
    except Exception as ex:
        missing = _prism_missing(runner, ex)
        if missing is not None:
            raise missing from ex
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
    return JobSummary(wall, counters, kernel_s, launch.output.rows_written())
