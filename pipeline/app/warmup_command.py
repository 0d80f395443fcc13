"""`linstream warmup`: compile the Numba kernels a job with these models will call into the
on-disk cache (the work is `linstream.ops.warmup.warm_up`; this is its command line)."""

from __future__ import annotations

import argparse
import time

from linstream.ops.warmup import STATE_DTYPES, warm_up

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The warm-up's options."""
    p.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="SPEC",
        help="model spec or .safetensors file a job will use (repeatable; default: every "
        "built-in model)",
    )
    p.add_argument(
        "--state-dtype",
        default="float64",
        choices=tuple(STATE_DTYPES),
        help="the jobs' --state-dtype (both: each)",
    )


def run(args: argparse.Namespace) -> int:
    """Warm up as `args` say and print a line per model, then where the cache is."""
    from linstream.ops.model.runtime import builtin_models
    from linstream.ops.numba_cache import cache_folder

    models = args.model if args.model is not None else [f"builtin:{n}" for n in builtin_models()]
    t0 = time.perf_counter()
    for line in warm_up(models, STATE_DTYPES[args.state_dtype]):
        print(f"warm: {line}", flush=True)
    print(f"warm-up done in {time.perf_counter() - t0:.1f} s; kernels cached in {cache_folder()}")
    return 0
