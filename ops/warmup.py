"""Compile the Numba kernels a job will call into the on-disk cache, so that a new process (a
worker, the next `linstream embed`) loads them instead of compiling.

    linstream warmup [--model SPEC ...] [--state-dtype float64|float32|both]
    python -m linstream.ops.warmup [same options]

For each model (default: every built-in model) and state dtype this embeds a short chunk of zeros
with the numba backend twice: once with every kernel on its serial version and once on its
parallel one (a job picks either, by chunk length), which calls every kernel the model's forward
calls (the attention kernel at the model's head widths, the rule kernels of its rule layers and
their gather, the fused norm and activation passes) with the signatures a job's chunks have.
The kernels go to ``NUMBA_CACHE_DIR`` when it is set, else beside the package (or Numba's
per-user cache folder where the package's folder is read-only).  The container images run it at
build time.  Numba's cache holds code for the CPU it was built on: a machine with another CPU
model compiles once per process, as without the cache (the job says so in one line).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

# NumPy, Numba and the model are imported in the functions that use them: the command line
# builds this parser for every `linstream` command.

__all__ = ["STATE_DTYPES", "add_arguments", "run", "warm_up"]

STATE_DTYPES = {"float64": ("float64",), "float32": ("float32",), "both": ("float64", "float32")}
# tokens per warm-up chunk: short enough to stay on the calling thread (no row split)
_TOKENS = 4


def warm_up(models: Sequence[str], state_dtypes: Sequence[str] = ("float64",)) -> list[str]:
    """Run each model's forward on both kernel versions; returns a line per model and state
    dtype: how many functions compiled (0: all were in the cache already) and how long."""
    import numpy as np
    from linstream.ops.model.runtime import load_model

    from .numba_cache import recording_compiles
    from .numba_tools import only_version

    lines = []
    for spec in models:
        model = load_model(spec)
        cfg = model.config
        inputs = (
            np.zeros(_TOKENS, dtype=np.int32)
            if cfg.input_kind == "tokens"
            else np.zeros((_TOKENS, int(cfg.input_dim or 0)), dtype=np.float32)
        )
        for sdt in state_dtypes:
            t0 = time.perf_counter()
            with recording_compiles() as names:
                for parallel in (False, True):
                    with only_version(parallel):
                        model.embed_chunk(inputs, model.initial_states(sdt), backend="numba")
            seconds = time.perf_counter() - t0
            what = f"{len(names)} function(s) compiled" if names else "all from the cache"
            lines.append(f"model {spec}, state {sdt}: {what} ({seconds:.1f} s)")
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The warm-up's options (shared by `linstream warmup` and `python -m`)."""
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

    from .numba_cache import cache_folder

    models = args.model if args.model is not None else [f"builtin:{n}" for n in builtin_models()]
    t0 = time.perf_counter()
    for line in warm_up(models, STATE_DTYPES[args.state_dtype]):
        print(f"warm: {line}", flush=True)
    print(f"warm-up done in {time.perf_counter() - t0:.1f} s; kernels cached in {cache_folder()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Compile linstream's Numba kernels into the cache.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
