"""`linstream embed`: check, run and report a job: its summary lines and exit status, or, when
it is stopped (SIGINT, SIGTERM), the one line of what its commits cover and how to resume.

The checks come first (`launch.prepare_launch`, before Beam is imported); Beam's own parsers
then check the values of the Beam options given (`check_beam_values`); the job runs in a thread
that a signal stops (`stopping.run_stoppable`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from linstream.pipeline.errors import UsageError

from .cli_logging import quiet_beam
from .job_summary import EXIT_DEAD_LETTERS, EXIT_OK, dead_letter_verdict

if TYPE_CHECKING:
    from .options import EmbedConfig

__all__ = ["check_beam_values", "run"]

_PROG = "linstream"


def _note(line: str) -> None:
    print(f"linstream embed: {line}", file=sys.stderr, flush=True)


def _resume_command(config: EmbedConfig, argv: list[str]) -> str:
    again = list(argv)
    if not config.resume:
        again.append("--resume")
    return shlex.join([_PROG, *again])


def _exit_at_once(signum: int, _frame: object) -> None:
    """A second SIGINT/SIGTERM while a stop publishes: leave now (the next --resume publishes
    what this stop did not)."""
    name = signal.Signals(signum).name
    print(
        f"linstream embed: stopped again by {name}: what the commits cover and is not published "
        "yet is published by the next --resume",
        file=sys.stderr,
        flush=True,
    )
    os._exit(128 + signum)


def _report_stop(
    config: EmbedConfig, argv: list[str], signame: str, rest: list[str], cancelled: bool = False
) -> None:
    from .runners import is_local_runner, runner_of
    from .stopping import publish_committed, readable_rows, remove_stale_temporaries

    runner = runner_of(rest)
    if not is_local_runner(runner):
        if cancelled:
            again = "; run it again with --resume to continue" if config.checkpoint_dir else ""
            what = (
                f"the job was cancelled on {runner} too (its LOOPBACK workers ran in this "
                f"process){again}"
            )
        else:
            what = f"stopped waiting; the job goes on running on {runner} (cancel it there)"
        print(f"linstream embed: stopped by {signame}: {what}", file=sys.stderr)
        return
    output = str(config.output).rstrip("/")
    late = ""
    if config.commits_outputs and config.checkpoint_dir:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _exit_at_once)
        try:
            publish_committed(output, config.checkpoint_dir)
        except Exception as ex:  # the commits stand: the next --resume publishes their results
            why = f"{type(ex).__name__}: {ex}".splitlines()[0][:200]
            late = f" (not all published now: {why}; the next --resume publishes them)"
    removed = remove_stale_temporaries(output)
    try:
        rows: int | None = readable_rows(output)
    except (OSError, ValueError):
        rows = None
    if rows is None:
        readable = f"the result rows under {output}/results are readable"
    else:
        readable = f"{rows:,} result row(s) readable under {output}/results"
    if config.checkpoint_dir:
        readable += " (every chunk its checkpoints cover)" + late
    tidy = f", {len(removed)} temporary folder(s) removed" if removed else ""
    if config.checkpoint_dir:
        tail = f"resume with: {_resume_command(config, argv)}"
    else:
        again = " with --output-mode overwrite" if rows != 0 else ""
        tail = (
            f"nothing can be resumed without --checkpoint-dir (run it again{again} to start over)"
        )
    print(f"linstream embed: stopped by {signame}: {readable}{tidy}; {tail}", file=sys.stderr)


def run(args: argparse.Namespace, rest: list[str]) -> int:
    """`linstream embed` with its parsed flags and the Beam arguments: its exit status."""
    from .launch import prepare_launch
    from .options import EmbedConfig
    from .runners import is_local_runner, runner_of

    config = EmbedConfig.from_args(args)  # parsed once; everything below reads this
    launch = prepare_launch(config, rest)  # every usage check, before Beam is imported
    if config.initial_state:  # each state file read against the model, before any work
        from linstream.pipeline.stage.initial_states import (
            check_files,
            model_spec,
            parse_initial_state,
        )

        spec = model_spec(launch.model, config.state_dtype)
        check_files(parse_initial_state(config.initial_state), spec)
    quiet_beam(args)
    check_beam_values(rest)
    from .job import run_embed
    from .stopping import Stopped, run_stoppable

    try:
        summary = run_stoppable(lambda: run_embed(config, rest, log=_note, launch=launch))
    except Stopped as stop:
        _report_stop(config, args.argv, str(stop), rest, cancelled=stop.hooks_done > 0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.exit_code)  # the runner's threads are not joined: they were stopped
    out = str(config.output).rstrip("/")
    runner = runner_of(rest)
    if not summary.counters and not is_local_runner(runner):  # e.g. a dry run, or no metrics
        print(f"linstream embed: handed to {runner}; its counters are on the runner's job page")
        print(f"results in {out}/results/")
        return EXIT_OK
    where = f" in {out}/dead_letters/" if summary.dead_letters else ""
    print(f"linstream embed: {summary.line()}")
    print(f"linstream embed: {summary.dead_letter_line()}{where}")
    if summary.rows_written is None:
        print(f"results in {out}/results/")
    else:
        print(f"linstream embed: {summary.rows_written:,} result row(s) written to {out}/results/")
    verdict = dead_letter_verdict(summary, config.max_dead_letters)
    if verdict:
        print(f"linstream embed: exit 3: {verdict}", file=sys.stderr)
        return EXIT_DEAD_LETTERS
    return EXIT_OK


def check_beam_values(rest: list[str]) -> None:
    """The values of Beam's options in ``rest``, as Beam's own parsers read them (Beam is
    imported by now): e.g. `--direct_num_workers` without a number."""
    if not rest:
        return
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    from .options import _linstream_options

    _linstream_options()  # registers LinstreamOptions' spellings with Beam's parsers

    class _Quiet(_BeamArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(message)

    parser = _Quiet(allow_abbrev=False)
    seen: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # the same parsers Beam itself builds
    parser.parse_known_args(rest)
