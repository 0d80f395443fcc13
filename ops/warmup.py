"""Compile the Numba kernels ahead of time, so a fresh worker loads them from the cache.

    python -m linstream.ops.warmup [--model SPEC ...]

The kernels are compiled with ``cache=True``: the first call for each signature writes the
compiled code next to the package (or under ``NUMBA_CACHE_DIR``) and every later process loads
it in milliseconds instead of compiling for 15-50 s.  A signature is the compute dtype
(float32, float64), the state dtype (float64, float32) and the kernel (the loop kernel for
short or narrow chunks, the blocked one for long chunks), so this calls the public
`causal_linear_attention` for each combination, and `EmbeddingModel.embed_chunk` for each
model named (default: every built-in model) with both state dtypes and both chunk regimes.
The container images run it at build time.  Numba's cache is specific to the CPU it was built
on; a worker with another CPU model compiles once per process, as without the cache.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
from linstream.ops.model.runtime import builtin_models, load_model

from .attention import causal_linear_attention

__all__ = ["warm_up"]

_DTYPES = (np.float32, np.float64)
#: (tokens, width): a short narrow chunk (loop kernel) and a long wide one (blocked kernel).
_REGIMES = ((4, 8), (256, 64))


def warm_up(models: Sequence[str] = (), *, backend: str = "numba") -> list[str]:
    """Run every kernel signature once on zeros; returns a line per thing compiled."""
    done = []
    for compute in _DTYPES:
        for state in _DTYPES:
            for t, d in _REGIMES:
                x = np.zeros((t, 2, d), dtype=compute)
                causal_linear_attention(x, x, x, backend=backend, state_dtype=state)
            done.append(f"attention compute {np.dtype(compute).name} state {np.dtype(state).name}")
    for spec in models:
        model = load_model(spec)
        cfg = model.config
        for state in _DTYPES:
            for t, _d in _REGIMES:
                inputs = (
                    np.zeros(t, dtype=np.int32)
                    if cfg.input_kind == "tokens"
                    else np.zeros((t, int(cfg.input_dim or 0)), dtype=np.float32)
                )
                model.embed_chunk(inputs, model.initial_states(state), backend=backend)
            done.append(f"model {spec} state {np.dtype(state).name}")
    return done


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Compile linstream's Numba kernels into the cache.")
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="model spec to warm up (repeatable; default: every built-in model)",
    )
    args = p.parse_args(argv)
    models = args.model if args.model is not None else [f"builtin:{n}" for n in builtin_models()]
    t0 = time.perf_counter()
    for line in warm_up(models):
        print(f"warm: {line}", flush=True)
    print(f"warm-up done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
