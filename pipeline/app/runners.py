"""The Beam runner a `linstream embed` names, and its arguments, read before Beam is imported.

    runner_of(beam_args)           the `--runner` named (the last one), else FnApiRunner
    is_local_runner(runner)        whether its workers run on this machine
    check_beam_args(beam_args)     refuse what is neither a linstream option nor a Beam one (on
                                   the runners that run in this process)
    prism_args(beam_args)          `--prism_location` of a Prism the project fetched, if needed

Beam's own option names are read from the source of its `pipeline_options` module (Python's
`ast`, a few milliseconds), not by importing Beam (about two seconds): a mistyped option is a
usage error before anything heavy is imported.  Beam's parsers still check the options' values
when the job's `PipelineOptions` are made.

Prism: without `--prism_location`, Beam downloads the Prism binary of its version from GitHub
(into `~/.apache_beam/cache/prism`), which fails on a machine without internet.  `prism_args`
points it at the binary `deploy/engines/fetch.sh prism` fetched (the engines cache, as
`make test` fills it: `$LINSTREAM_ENGINES_CACHE`, default `~/.cache/linstream/engines`), when
that one is of Beam's version; `PRISM_HINT` says how to get one when Beam cannot.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
from importlib.metadata import PackageNotFoundError, version

from linstream.pipeline.errors import UsageError

__all__ = [
    "DEFAULT_LOCAL_RUNNER",
    "LOCAL_RUNNERS",
    "PRISM_HINT",
    "beam_option_names",
    "check_beam_args",
    "is_local_runner",
    "prism_args",
    "prism_binary",
    "runner_of",
]

#: The local runner that needs no download (the default DirectRunner may fetch Prism).
DEFAULT_LOCAL_RUNNER = "FnApiRunner"
#: Runners whose workers run on this machine (a check of this machine's GPU holds for them, a
#: stop kills them, and the kernels they compile are this machine's).
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "PrismRunner")
#: The runners that run the pipeline in this Python process: every option they take is Beam's.
IN_PROCESS_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner")


def runner_of(beam_args: list[str]) -> str:
    """The `--runner` the Beam arguments name (the last one given), else the local default."""
    runner = DEFAULT_LOCAL_RUNNER
    for i, arg in enumerate(beam_args):
        if arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
        elif arg == "--runner" and i + 1 < len(beam_args):
            runner = beam_args[i + 1]
    return runner or DEFAULT_LOCAL_RUNNER


def is_local_runner(runner: str) -> bool:
    """Whether `runner` (a name or a dotted path) runs its workers on this machine."""
    return runner.rsplit(".", 1)[-1] in LOCAL_RUNNERS


# -- Beam's option names, without importing Beam ------------------------------------------------
@functools.cache
def beam_option_names() -> frozenset[str]:
    """Every option string Beam's `PipelineOptions` subclasses add (`--runner`, ...), read from
    the installed `apache_beam/options/pipeline_options.py` (empty when Beam is missing)."""
    spec = importlib.util.find_spec("apache_beam")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return frozenset()
    path = os.path.join(os.path.dirname(spec.origin), "options", "pipeline_options.py")
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("add_argument", "add_value_provider_argument")
        ):
            names.update(
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and arg.value.startswith("-")
            )
    return frozenset(names)


def check_beam_args(beam_args: list[str], own: list[str]) -> None:
    """UsageError naming the first argument that is neither one of ``own`` (linstream's option
    strings) nor a Beam pipeline option, with the closest name; and a `--runner` without a
    value.  The values of Beam's options are Beam's parsers' to check."""
    if (beam_args and beam_args[-1] == "--runner") or "--runner=" in beam_args:
        msg = "--runner needs a value (e.g. FnApiRunner, DataflowRunner)"
        raise UsageError(msg)
    if runner_of(beam_args).rsplit(".", 1)[-1] not in IN_PROCESS_RUNNERS:
        # A runner with a job server of its own (Flink, Spark, Prism, Dataflow, PortableRunner)
        # defines options Beam's Python side does not (Flink's --number_of_execution_retries):
        # Beam hands them on to it, and it checks them.
        return
    beam = beam_option_names()
    known = set(own) | beam
    for arg in beam_args:
        if not arg.startswith("-"):
            continue  # a value of the option before it (Beam's parser checks the pairs)
        name = arg.split("=", 1)[0]
        if name in known or name == "--":
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        msg = f"unknown option {name}{hint} (not a linstream option nor a Beam pipeline option)"
        raise UsageError(msg)


# -- Prism ---------------------------------------------------------------------------------------
def _beam_version() -> str | None:
    try:
        return version("apache-beam")
    except PackageNotFoundError:
        return None


def engines_cache() -> str:
    """Where `deploy/engines/fetch.sh` puts the engines (`make test` fetches them there)."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "linstream", "engines")
    return os.environ.get("LINSTREAM_ENGINES_CACHE") or default


def prism_binary() -> str | None:
    """The Prism binary of Beam's version that `deploy/engines/fetch.sh prism` fetched (marked
    ready), or None."""
    beam = _beam_version()
    if beam is None:
        return None
    folder = os.path.join(engines_cache(), f"prism-v{beam}")
    binary = os.path.join(folder, "prism")
    ready = os.path.isfile(os.path.join(folder, "ready"))
    return binary if ready and os.access(binary, os.X_OK) else None


def _names_prism_location(beam_args: list[str]) -> bool:
    return any(
        a in ("--prism_location", "--prism-location") or a.startswith("--prism_location=")
        for a in beam_args
    )


def prism_args(beam_args: list[str]) -> list[str]:
    """``beam_args`` with `--prism_location=<the fetched binary>` added when the runner is
    Prism, none is named and the engines cache holds one of Beam's version (else Beam looks in
    its own cache and downloads)."""
    if runner_of(beam_args).rsplit(".", 1)[-1] != "PrismRunner" or _names_prism_location(beam_args):
        return list(beam_args)
    binary = prism_binary()
    return [*beam_args, f"--prism_location={binary}"] if binary else list(beam_args)


#: What to do when Beam could not get a Prism binary (no internet, no cached one).
PRISM_HINT = (
    "PrismRunner: no Prism binary of Beam {version} in {cache} nor in Beam's cache, and Beam "
    "could not download one ({why}); fetch it with `deploy/engines/fetch.sh prism` (linstream's "
    "source tree; needs Go) or pass --prism_location=PATH"
)


def prism_hint(error: str) -> str:
    """`PRISM_HINT` for this machine, with the end of the download's ``error`` as the why."""
    why = error.rsplit(": ", 1)[-1].strip() or error
    return PRISM_HINT.format(version=_beam_version(), why=why[:100], cache=engines_cache())
