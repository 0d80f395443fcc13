"""The `linstream` command line: sample, embed, demo, checkpoint inspect|verify."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

__all__ = ["main"]


def _model_input(spec: str) -> tuple[int | None, int | None]:
    """(vocab_size, input_dim) of a model spec, so that samples are valid for it."""
    from linstream.ops import load_model

    cfg = load_model(spec).config
    return (cfg.vocab_size, None) if cfg.input_kind == "tokens" else (None, cfg.input_dim)


def _cmd_sample(args: argparse.Namespace, _rest: list[str]) -> int:
    from .sample import write_sample

    vocab, dim = (args.vocab_size, args.input_dim)
    if vocab is None and dim is None:
        vocab, dim = _model_input(args.model)
    paths = write_sample(
        args.output,
        args.sequences,
        args.tokens,
        args.chunk_size,
        args.seed,
        shuffle=args.shuffle,
        duplicates=args.duplicates,
        vocab_size=vocab,
        input_dim=dim,
        files=args.files,
    )
    n_chunks = args.sequences * -(-args.tokens // args.chunk_size) + args.duplicates
    print(
        f"wrote {n_chunks} chunks ({args.sequences} sequences x {args.tokens} tokens, "
        f"chunk size {args.chunk_size}) to {', '.join(paths)}"
    )
    return 0


def _cmd_embed(args: argparse.Namespace, rest: list[str]) -> int:
    from .job import run_embed

    summary = run_embed(args, rest)
    print(f"linstream embed: {summary.line()}")
    print(f"results in {args.output}")
    return 0


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    from .demo import run_demo

    return run_demo(args, rest)


def _add_sample(sub: Any) -> None:
    p = sub.add_parser("sample", help="write a synthetic chunk dataset (Parquet)")
    p.add_argument("--output", required=True, help="directory for the chunk files")
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16384, help="tokens per sequence")
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action="store_true", help="scramble the chunk order")
    p.add_argument("--duplicates", type=int, default=0, help="chunks to repeat")
    p.add_argument("--files", type=int, default=1, help="number of files")
    p.add_argument("--model", default="builtin:default", help="model whose inputs to sample")
    p.add_argument("--vocab-size", type=int, default=None, help="token ids in [0, V)")
    p.add_argument("--input-dim", type=int, default=None, help="feature vectors instead")
    p.set_defaults(func=_cmd_sample)


def _add_embed(sub: Any) -> None:
    from .job import add_embed_arguments

    p = sub.add_parser(
        "embed",
        help="run the embed job (unknown options are Beam pipeline options)",
        description="Embed chunked sequences.  Options not listed here are passed to Beam as "
        "pipeline options (e.g. --runner, --direct_num_workers=2 "
        "--direct_running_mode=multi_processing); the runner defaults to FnApiRunner.",
    )
    add_embed_arguments(p)
    p.set_defaults(func=_cmd_embed)


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="sample, embed part, stop, resume the rest, check against one run"
    )
    p.add_argument("--workdir", default=None, help="keep files here (default: a temp dir)")
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32768, help="tokens per sequence")
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="builtin:default")
    p.add_argument("--backend", default="auto")
    p.set_defaults(func=_cmd_demo)


def _add_checkpoint(sub: Any) -> None:
    try:
        from .checkpoint_cli import add_checkpoint_parser
    except ImportError as ex:
        reason = str(ex)

        def unavailable(_args: argparse.Namespace) -> int:
            print(f"linstream checkpoint is not available here: {reason}", file=sys.stderr)
            return 2

        p = sub.add_parser("checkpoint", help="inspect or verify a checkpoint store")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=unavailable)
        return
    add_checkpoint_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="linstream", description="Causal linear attention over unbounded sequences (Beam)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_sample(sub)
    _add_embed(sub)
    _add_demo(sub)
    _add_checkpoint(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in ("embed", "demo"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    func = args.func
    try:
        rc = func(args, rest) if args.command in ("sample", "embed", "demo") else func(args)
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
