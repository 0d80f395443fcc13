"""The `linstream` command line: sample, embed, demo, warmup, checkpoint inspect|verify|gc, results
inspect.

Exit status: 0 ok; 1 the job (or a command) failed at run time; 2 a usage error (a bad flag, a
missing input, an unknown model, no GPU for `--backend cupy`); 3 the dead letters passed the
`--max-dead-letters` rule; 130 stopped by SIGINT; 143 stopped by SIGTERM.  Every error is one
line on stderr; `-v` adds the traceback.  No command imports Beam before its flags are read and
checked (a usage error is one line in well under a second); `linstream --help` and
`linstream checkpoint ...` never import it.

(About 450 lines: one parser per subcommand and the one-line errors and exit statuses they share;
logging, options, the job and the checkpoint commands have their own modules.)
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

from .cli_logging import quiet_imports, setup_logging, verbosity
from .closed_stdout import tolerate_closed_stdout

if TYPE_CHECKING:
    from .options import EmbedConfig

__all__ = [
    "EXIT_DEAD_LETTERS",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_DEAD_LETTERS = 0, 1, 2, 3
_PROG = "linstream"
_log = logging.getLogger("linstream.cli")


class _Usage(Exception):
    """A usage error found by the command line itself (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `linstream embed: error: ... (see linstream embed --help)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


class _DefaultsFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default (unless the help already names it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text
            or action.required
            or not action.option_strings
            or action.default is argparse.SUPPRESS
            or action.nargs == 0  # flags: --help, --version, store_true
        ):
            return text
        return f"{text} (default: %(default)s)"


_DEFAULTS = _DefaultsFormatter


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("linstream")
    except PackageNotFoundError:
        return "unknown"


# -- commands -----------------------------------------------------------------------------------
def _quiet_beam(args: argparse.Namespace) -> None:
    """Import Beam (once the flags are checked) without its import-time lines, unless -v."""
    with quiet_imports(int(getattr(args, "verbose", 0) or 0)):
        import apache_beam  # noqa: F401 - imported here, where its import-time lines are quiet


def _cmd_sample(args: argparse.Namespace, _rest: list[str]) -> int:
    _quiet_beam(args)  # its chunk files are written with Beam's I/O
    from .sample import model_input, write_sample

    vocab, dim = (args.vocab_size, args.input_dim)
    if vocab is None and dim is None:
        vocab, dim = model_input(args.model)
    paths = write_sample(
        args.output,
        args.sequences,
        args.tokens,
        args.chunk_tokens,
        args.seed,
        shuffle=args.shuffle,
        duplicates=args.duplicates,
        vocab_size=vocab,
        input_dim=dim,
        files=args.files,
    )
    n_chunks = args.sequences * -(-args.tokens // args.chunk_tokens) + args.duplicates
    print(
        f"wrote {n_chunks} chunks ({args.sequences} sequences x {args.tokens} tokens, "
        f"{args.chunk_tokens} tokens per chunk) to {', '.join(paths)}"
    )
    return EXIT_OK


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
            late = f" (not all published now: {_one_line(ex)}; the next --resume publishes them)"
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


def _cmd_embed(args: argparse.Namespace, rest: list[str]) -> int:
    from .job_summary import dead_letter_verdict
    from .launch import prepare_launch
    from .options import EmbedConfig
    from .runners import is_local_runner, runner_of

    config = EmbedConfig.from_args(args)  # parsed once; everything below reads this
    launch = prepare_launch(config, rest)  # every usage check, before Beam is imported
    _quiet_beam(args)
    _check_beam_values(rest)
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


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    from .launch import check_pass_through

    check_pass_through(rest)  # its Beam arguments, before Beam is imported
    _quiet_beam(args)
    _check_beam_values(rest)
    from .demo import run_demo

    return run_demo(args, rest)


def _check_beam_args(rest: list[str]) -> None:
    """Refuse what is neither a linstream option nor a Beam pipeline option (typos), naming the
    closest option; then let Beam's parsers check its options' values."""
    from .launch import check_pass_through

    check_pass_through(rest)
    _check_beam_values(rest)


def _check_beam_values(rest: list[str]) -> None:
    """The values of Beam's options in ``rest``, as Beam's own parsers read them (Beam is
    imported by now): e.g. `--direct_num_workers` without a number."""
    if not rest:
        return
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    from .options import _linstream_options

    _linstream_options()  # registers LinstreamOptions' spellings with Beam's parsers

    class _Quiet(_BeamArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise _Usage(message)

    parser = _Quiet(allow_abbrev=False)
    seen: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # the same parsers Beam itself builds
    parser.parse_known_args(rest)


# -- parsers ------------------------------------------------------------------------------------
class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option: sets the same value and says once, in one line, which
    spelling to use instead."""

    def __init__(self, *args: Any, instead: str, **kwargs: Any) -> None:
        self.instead = instead
        super().__init__(*args, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: Any, opt: Any = None
    ) -> None:
        print(
            f"{parser.prog}: warning: {opt} is deprecated; use {self.instead} (same meaning)",
            file=sys.stderr,
        )
        setattr(ns, self.dest, value)


def _chunk_tokens(p: argparse.ArgumentParser, default: int) -> None:
    """`--chunk-tokens N`, as `linstream embed` spells it; `--chunk-size` is its old name."""
    p.add_argument(
        "--chunk-tokens", type=int, default=default, metavar="N", help="tokens per chunk"
    )
    p.add_argument(
        "--chunk-size",
        dest="chunk_tokens",
        type=int,
        default=argparse.SUPPRESS,
        action=_DeprecatedAlias,
        instead="--chunk-tokens",
        metavar="N",
        help="deprecated: the old name of --chunk-tokens (same default)",
    )


def _verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="more log lines (-vv: debug); show tracebacks of errors",
    )


def _add_sample(sub: Any) -> None:
    p = sub.add_parser(
        "sample", help="write a synthetic chunk dataset (Parquet)", formatter_class=_DEFAULTS
    )
    p.add_argument("--output", required=True, help="directory for the chunk files")
    p.add_argument("--sequences", type=int, default=4, help="number of sequences")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per sequence")
    _chunk_tokens(p, 1024)
    p.add_argument("--seed", type=int, default=0, help="random seed of the data")
    p.add_argument("--shuffle", action="store_true", help="scramble the chunk order")
    p.add_argument("--duplicates", type=int, default=0, help="chunks to repeat")
    p.add_argument("--files", type=int, default=1, help="number of files")
    p.add_argument("--model", default="builtin:default", help="model whose inputs to sample")
    p.add_argument("--vocab-size", type=int, default=None, help="token ids in [0, V)")
    p.add_argument("--input-dim", type=int, default=None, help="feature vectors instead")
    _verbose(p)
    p.set_defaults(func=_cmd_sample)


_EMBED_HELP = "embed text or chunked sequences (other options are Beam pipeline options)"
_EMBED_DESCRIPTION = (
    "Embed sequences: a folder of text files, JSON Lines or Parquet text rows, token lists, or "
    "chunk Parquet.  Results go to <output>/results/ (Parquet), rejected input to "
    "<output>/dead_letters/ (JSON Lines).  Options not listed here must be Beam pipeline "
    "options (e.g. --runner, --direct_num_workers=2 --direct_running_mode=multi_processing); "
    "the runner defaults to FnApiRunner.  Exit status: 0 ok, 1 failed, 2 usage error, "
    "3 dead letters past --max-dead-letters, 130/143 stopped by SIGINT/SIGTERM."
)


def _add_embed(sub: Any, full: bool) -> None:
    p = sub.add_parser(
        "embed", help=_EMBED_HELP, description=_EMBED_DESCRIPTION, formatter_class=_DEFAULTS
    )
    if full:  # the option table: only when the command is `embed`
        from .job import add_embed_arguments

        add_embed_arguments(p)
        _verbose(p)
    p.set_defaults(func=_cmd_embed)


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="sample, embed part, stop, resume the rest, check against one run",
        formatter_class=_DEFAULTS,
    )
    p.add_argument("--workdir", default=None, help="keep files here (default: a temp dir)")
    p.add_argument("--sequences", type=int, default=4, help="number of sequences")
    p.add_argument("--tokens", type=int, default=32768, help="tokens per sequence")
    _chunk_tokens(p, 2048)
    p.add_argument("--seed", type=int, default=0, help="random seed of the data")
    p.add_argument("--model", default="builtin:default", help="model spec or .safetensors")
    p.add_argument(
        "--backend", default="auto", choices=("auto", "numpy", "numba", "cupy"), help="kernels"
    )
    _verbose(p)
    p.set_defaults(func=_cmd_demo)


def _add_warmup(sub: Any) -> None:
    from .warmup_command import add_arguments

    p = sub.add_parser(
        "warmup",
        help="compile the kernels a job with this model calls into the on-disk cache",
        description="Compile the Numba kernels that `linstream embed --model SPEC` calls, into "
        "NUMBA_CACHE_DIR (or beside the package), so that later jobs and worker processes on "
        "this machine load them instead of compiling.  A machine with another CPU model "
        "compiles once per process, as without the cache.",
        formatter_class=_DEFAULTS,
    )
    add_arguments(p)
    _verbose(p)
    p.set_defaults(func=_cmd_warmup)


def _cmd_warmup(args: argparse.Namespace) -> int:
    from .warmup_command import run

    return run(args)


def _add_results(sub: Any) -> None:
    from .results_cli import add_results_parser

    parser = add_results_parser(sub)
    _verbose(parser)


def _add_checkpoint(sub: Any) -> None:
    from .checkpoint_cli import add_checkpoint_parser

    parser = add_checkpoint_parser(sub)
    _verbose(parser)


def build_parser(command: str | None = "embed") -> argparse.ArgumentParser:
    """The `linstream` parser; the embed options are only added when `command` is `embed`."""
    parser = _Parser(
        prog=_PROG,
        description="Causal linear attention over unbounded sequences, as an Apache Beam job.",
        epilog="Start with `linstream embed --input my-texts/ --output out/`; "
        "`linstream COMMAND --help` shows each command's options and defaults.",
    )
    parser.add_argument("--version", action="version", version=f"linstream {_version()}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log lines; tracebacks of errors"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sample(sub)
    _add_embed(sub, full=command == "embed")
    _add_demo(sub)
    _add_warmup(sub)
    _add_checkpoint(sub)
    _add_results(sub)
    return parser


def _command_of(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, LookupError)


def _one_line(ex: BaseException) -> str:
    """A runner error's message can hold whole tracebacks: keep its last informative line (a
    usage error's own line is kept whole)."""
    from linstream.pipeline.errors import UsageError

    lines = [ln.strip() for ln in str(ex).splitlines() if ln.strip()]
    if isinstance(ex, UsageError) and len(lines) == 1:
        return lines[0]
    if not lines:
        return type(ex).__name__
    named = [ln for ln in lines if ln.split(":", 1)[0].endswith(("Error", "Exception"))]
    line = named[-1] if named else lines[-1]
    return line if len(line) <= 400 else line[:397] + "..."


def _fail(prog: str, ex: BaseException, code: int, verbose: int) -> int:
    if verbose:
        traceback.print_exception(ex)
    hint = "" if verbose or code == EXIT_USAGE else " (-v shows the traceback)"
    print(f"{prog}: error: {_one_line(ex)}{hint}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    with tolerate_closed_stdout():  # `linstream … | head -1` ends the output, not the command
        return _main(sys.argv[1:] if argv is None else list(argv))


def _main(argv: list[str]) -> int:
    command = _command_of(argv)
    levels = setup_logging(verbosity(argv))
    try:
        parser = build_parser(command)  # no Beam: it is imported once the flags are checked
        args, rest = parser.parse_known_args(argv)
        if rest and args.command not in ("embed", "demo"):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        verbose = int(getattr(args, "verbose", 0) or 0)
        return _run(args, rest, argv, verbose)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _run(args: argparse.Namespace, rest: list[str], argv: list[str], verbose: int) -> int:
    args.argv = [a for a in argv if a not in ("-v", "-vv", "--verbose")]
    prog = f"{_PROG} {args.command}"
    try:
        if args.command in ("sample", "embed", "demo"):
            rc = args.func(args, rest)
        else:
            rc = args.func(args)
    except KeyboardInterrupt:
        print(f"{prog}: stopped by SIGINT", file=sys.stderr)
        return 130
    except _Usage as ex:
        return _fail(prog, ex, EXIT_USAGE, verbose)
    except Exception as ex:
        from_run = type(ex).__name__ == "JobFailed"
        user = not from_run and isinstance(ex, _USER_ERRORS)
        if type(ex).__name__ == "BackendUnavailableError":
            user = True
        return _fail(prog, ex, EXIT_USAGE if user else EXIT_FAILURE, verbose)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
