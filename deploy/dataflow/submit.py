"""Submit the linstream embed job to a remote runner and return without waiting.

This is the Flex Template's launcher program (the launcher image copies it to /template/main.py)
and what deploy/dataflow/launch.sh runs.  It builds the same graph as `linstream embed`
(`linstream.pipeline.app.job.build_embed_pipeline`), then calls `pipeline.run()` and exits: a Flex
Template launcher must not wait for the job, and a streaming job never finishes.

    python deploy/dataflow/submit.py --output gs://B/out --pubsub_subscription projects/P/... \\
        --checkpoint-dir gs://B/ckpt --runner DataflowRunner --project P --region R ...

linstream's own options may be spelled with underscores (`--checkpoint_dir`), as Flex Template
parameters are, and boolean flags may carry a value (`--resume=true`, `--streaming=false`).
Every other option is a Beam pipeline option.  `--wait` blocks until a batch job ends.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

__all__ = ["build_parser", "main", "normalize_argv", "split_args"]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def build_parser() -> argparse.ArgumentParser:
    """The job's options: `linstream embed`'s, the streaming sources', and `--wait`."""
    from linstream.pipeline.app.job import add_embed_arguments
    from linstream.pipeline.io.streaming import add_streaming_args

    parser = argparse.ArgumentParser(
        prog="submit.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_embed_arguments(parser)
    add_streaming_args(parser)
    parser.add_argument(
        "--wait", action="store_true", help="wait for the job to finish (batch jobs only)"
    )
    return parser


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings if s.startswith("--")}


def normalize_argv(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Map `--checkpoint_dir` to `--checkpoint-dir` and `--flag=true|false` to `--flag` or nothing.

    Only options this parser knows are rewritten; Beam options pass through unchanged.
    """
    flags = _flags(parser)
    out: list[str] = []
    for arg in argv:
        if not arg.startswith("--"):
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if name not in flags and name.replace("_", "-") in flags:
            name = name.replace("_", "-")
        action = flags.get(name)
        if isinstance(action, argparse._StoreTrueAction) and eq:
            if value.strip().lower() in _TRUE:
                out.append(name)
            elif value.strip().lower() not in _FALSE:
                msg = f"{name} takes true or false, got {value!r}"
                raise SystemExit(msg)
            continue
        out.append(name + eq + value)
    return out


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(linstream options, Beam pipeline arguments) from a command line."""
    parser = build_parser()
    args, beam_args = parser.parse_known_args(normalize_argv(parser, argv))
    return args, beam_args


def main(argv: list[str] | None = None) -> Any:
    """Build the embed pipeline from `argv`, run it, and return the `PipelineResult`."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from linstream.pipeline.app.job import build_embed_pipeline
    from linstream.pipeline.app.options import EmbedConfig

    args, beam_args = split_args(sys.argv[1:] if argv is None else list(argv))
    if args.streaming and "--streaming" not in beam_args:
        beam_args.append("--streaming")
    options = PipelineOptions(beam_args)
    pipeline = beam.Pipeline(options=options)
    build_embed_pipeline(pipeline, EmbedConfig.from_args(args))
    result = pipeline.run()
    if args.wait and not args.streaming:
        result.wait_until_finish()
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    main()
