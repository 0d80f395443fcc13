"""Everything `linstream embed` checks before a pipeline exists, each check once, in one pass.

`prepare_launch(config, beam_args)` runs the checks in the order of their cost, and returns the
`Launch` the job is built from (what the checks found: the input plan, the model, the work
left, the output folder's plan), so that nothing is looked at twice:

1. the flags alone: a required one missing, `--resume` without `--checkpoint-dir`, an argument
   that is neither a linstream nor a Beam option (with the closest name), `--runner` without a
   value;
2. the folders: `--output` and `--checkpoint-dir` naming a file, or a local folder this user
   cannot write (a read-only one); an `--output` that holds results a job of this mode may not
   add to (second_run.py: the rules that need no model);
3. the model's name (a built-in one that exists, a local path that exists), the input's files
   (it names some), the backend (`--backend cupy` needs a GPU here, for a local runner), the
   checkpoint store, opened once (one that holds checkpoints needs `--resume`);
4. the model, loaded once (a missing file is named), and `--layer` against it; the input's plan
   (`plan_input`: the format, the tokenizer against the model's vocabulary), and what the job
   has to do (a resumed job's progress total leaves out what the store holds);
5. the rest of the output folder's rules, which need the model (its rows fit the folder's).

`--threads` is applied first of all (Numba sizes its thread pool when a model first imports it).
Each failure is a `UsageError` (exit status 2, one line); nothing is created or deleted before
they have all passed (`Launch.output.apply()` does that, right before the run).  No Beam here:
a usage error costs the flags, the files and the model's loading, not Beam's import.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from linstream.pipeline.errors import UsageError
from linstream.pipeline.io.input_plan import InputPlan, input_files, missing_model, plan_input
from linstream.pipeline.io.reader_config import StreamConfig
from linstream.pipeline.stage.model_layer import checked_layer

from .options import EMBED_FLAGS, EmbedConfig
from .runners import check_beam_args, is_local_runner, runner_of
from .second_run import OutputPlan, check_checkpoint_dir, check_output_folder
from .work_left import tokens_to_do

#: The `-v` line of the threads the kernels and BLAS use (a logger of its own: not a stage's).
_log = logging.getLogger("linstream.threads")

__all__ = ["Launch", "check_flags", "check_pass_through", "load_job_model", "prepare_launch"]


@dataclass(frozen=True)
class Launch:
    """What the checks found, handed to the job: nothing in it is looked up again."""

    config: EmbedConfig
    beam_args: tuple[str, ...]
    #: the input's plan (None: --streaming reads a source, not files)
    inputs: InputPlan | None
    #: the model, loaded on this machine (its width and fingerprint name the results)
    model: Any
    #: tokens the job has to do, when counted before the run (the progress line's 100%)
    total_tokens: int | None
    #: the output folder's rules, applied (`apply`) right before the run
    output: OutputPlan

    @property
    def runner(self) -> str:
        return runner_of(list(self.beam_args))


def _own_option_strings() -> list[str]:
    own = [s for flag in EMBED_FLAGS for s in flag.spellings()]
    own += [f"--{name}" for name in StreamConfig.__dataclass_fields__]
    return [*own, "--streaming", "-v", "-vv", "--verbose"]


def check_pass_through(beam_args: list[str] | tuple[str, ...]) -> None:
    """The arguments the parser left (Beam's): UsageError for one that is neither a linstream
    nor a Beam option, naming the closest one."""
    check_beam_args(list(beam_args), _own_option_strings())


def check_flags(config: EmbedConfig, beam_args: list[str] | tuple[str, ...] = ()) -> None:
    """Step 1: what the flags alone say (UsageError)."""
    check_pass_through(beam_args)
    for flag in EMBED_FLAGS:
        if flag.required and getattr(config, flag.dest) in (None, ""):
            msg = f"the following arguments are required: --{flag.name}"
            raise UsageError(msg)
    if config.resume and not config.checkpoint_dir:
        msg = "--resume needs --checkpoint-dir (the checkpoint store to continue from)"
        raise UsageError(msg)


def _check_folder(flag: str, path: str | None) -> None:
    """A local folder the job will write: not a file, and writable by this user (it, or the
    nearest folder above it that exists, where it will be made).  URLs are their store's."""
    if not path or "://" in path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        msg = f"{flag} {path}: expected a folder, found a file"
        raise UsageError(msg)
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        msg = f"{flag} {path}: cannot make the folder, {probe} is a file"
        raise UsageError(msg)
    where = "" if probe == os.path.abspath(path) else f" ({probe}, where it would be made)"
    try:  # a file made and removed at once: what this user may do there (root too, read-only)
        fd, name = tempfile.mkstemp(prefix=".linstream-probe-", dir=probe)
        os.close(fd)
        os.remove(name)
    except OSError as ex:
        msg = f"{flag} {path}: the folder is not writable here{where}: {ex.strerror}"
        raise UsageError(msg) from None


def check_model_spec(spec: str) -> None:
    """What can be told of ``--model`` without reading it: a built-in name that exists, a local
    path that exists (UsageError)."""
    if spec.startswith("builtin:"):
        from linstream.ops.model.runtime import BUILTIN_PREFIX, builtin_models

        name = spec.removeprefix(BUILTIN_PREFIX)
        if name not in builtin_models():
            msg = f"--model {spec}: unknown built-in model {name!r}; available: {builtin_models()}"
            raise UsageError(msg)
    elif "://" not in spec and not os.path.exists(spec):
        raise missing_model(spec)


def load_job_model(config: EmbedConfig) -> Any:
    """The job's model, loaded in its compute mode (UsageError naming a missing one)."""
    import numpy as np
    from linstream.ops import load_model

    try:
        return load_model(config.model, compute_dtype=config.compute_dtype or np.float32)
    except FileNotFoundError as ex:
        raise missing_model(config.model) from ex


def _check_backend(config: EmbedConfig, runner: str) -> None:
    """A remote runner's workers have their own GPUs: they check theirs when the stage starts
    (EmbedStep.setup refuses a backend that cannot run there); only a local run checks here."""
    if config.backend != "cupy" or not is_local_runner(runner):
        return
    from linstream.ops.backend import cupy_unavailable_reason

    reason = cupy_unavailable_reason()
    if reason:
        msg = f"--backend cupy: no usable GPU here ({reason}); use --backend auto or numba"
        raise UsageError(msg)


def _log_threads() -> None:
    """`-v`: the threads the kernels and BLAS use here (`--threads`, else every core)."""
    if _log.isEnabledFor(logging.INFO):
        from linstream.ops.model.thread_limit import thread_counts

        numba_threads, blas = thread_counts()
        _log.info("threads: %d for the kernels (Numba), %d for BLAS", numba_threads, blas)


def _beam_filesystems(beam_args: list[str] | tuple[str, ...]) -> None:
    """Beam's filesystems configured from the job's Beam options (`--s3_endpoint_url`, the
    credentials, ...), as the pipeline configures them when it is made: listing a URL's input
    here, before the pipeline exists, needs them (Beam's S3 filesystem has no client without)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(list(beam_args)))


def prepare_launch(config: EmbedConfig, beam_args: list[str] | tuple[str, ...] = ()) -> Launch:
    """Run every check (the module docstring's order); the `Launch` the job is built from."""
    if config.threads is not None:  # first: Numba sizes its pool when a model first loads it
        from linstream.ops.model.thread_limit import limit_threads

        limit_threads(config.threads)
    check_flags(config, beam_args)
    _check_folder("--output", config.output)
    _check_folder("--checkpoint-dir", config.checkpoint_dir)
    folder = check_output_folder(config)
    check_model_spec(config.model)
    wanted = None if config.streaming else config.input_config()
    if wanted is not None and "://" in str(wanted.input):
        _beam_filesystems(beam_args)
    files = None if wanted is None else input_files(wanted)
    _check_backend(config, runner_of(list(beam_args)))
    store = None
    if config.checkpoint_dir:
        from linstream.state import CheckpointStore

        store = CheckpointStore(config.checkpoint_dir, background_prune=False)  # once a launch
    try:
        if store is not None:
            check_checkpoint_dir(config, store)
        model = load_job_model(config)
        checked_layer(config.layer, model)
        _log_threads()
        inputs = None if wanted is None else plan_input(wanted, files)
        total = None
        if inputs is not None and config.progress_every:  # the progress line's 100%
            total = tokens_to_do(inputs, store if config.resume else None)
        if store is not None:  # the checks passed: record a new --keep-every-tokens, say so once
            note = store.settle_keep_every(config.keep_every_tokens)
            if note:
                print(f"linstream embed: {note}", file=sys.stderr, flush=True)
    finally:
        if store is not None:
            store.close()
    cut = inputs is not None and inputs.format != "chunks"
    output = folder.plan(model, chunk_tokens=config.chunk_tokens if cut else None)
    return Launch(config, tuple(beam_args), inputs, model, total, output)
