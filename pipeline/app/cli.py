"""The `linstream` command line: sample, embed, demo, warmup, checkpoint
inspect|verify|gc|fork|rewind, state export, results inspect.

Exit status: 0 ok; 1 the job (or a command) failed at run time; 2 a usage error (a bad flag, a
missing input, an unknown model, no GPU for `--backend cupy`); 3 the dead letters passed the
`--max-dead-letters` rule; 130 stopped by SIGINT; 143 stopped by SIGTERM.  Every error is one
line on stderr; `-v` adds the traceback.  No command imports Beam before its flags are read and
checked (a usage error is one line in well under a second); `linstream --help` and
`linstream checkpoint ...` never import it.

(One parser per subcommand and the one-line errors and exit statuses they share; `embed`'s run
and its stop line, logging, options, the job and the checkpoint and results commands have
their own modules.)
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from typing import Any, NoReturn

from .cli_logging import quiet_beam, setup_logging, verbosity
from .closed_stdout import tolerate_closed_stdout
from .job_summary import EXIT_DEAD_LETTERS, EXIT_FAILURE, EXIT_OK, EXIT_USAGE

__all__ = [
    "EXIT_DEAD_LETTERS",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

_PROG = "linstream"
_log = logging.getLogger("linstream.cli")


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
def _cmd_sample(args: argparse.Namespace, _rest: list[str]) -> int:
    quiet_beam(args)  # its chunk files are written with Beam's I/O
    from .sample import run_sample

    return run_sample(args)


def _cmd_embed(args: argparse.Namespace, rest: list[str]) -> int:
    from .embed_command import run

    return run(args, rest)


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    from .launch import check_pass_through

    check_pass_through(rest)  # its Beam arguments, before Beam is imported
    quiet_beam(args)
    from .embed_command import check_beam_values

    check_beam_values(rest)
    from .demo import run_demo

    return run_demo(args, rest)


def _check_beam_args(rest: list[str]) -> None:
    """Refuse what is neither a linstream option nor a Beam pipeline option (typos), naming the
    closest option; then let Beam's parsers check its options' values."""
    from .launch import check_pass_through

    check_pass_through(rest)
    from .embed_command import check_beam_values

    check_beam_values(rest)


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


def _add_state(sub: Any) -> None:
    from .state_cli import add_state_parser

    parser = add_state_parser(sub)
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
    _add_state(sub)
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
    except Exception as ex:
        from_run = type(ex).__name__ == "JobFailed"
        user = not from_run and isinstance(ex, _USER_ERRORS)
        if type(ex).__name__ == "BackendUnavailableError":
            user = True
        return _fail(prog, ex, EXIT_USAGE if user else EXIT_FAILURE, verbose)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
