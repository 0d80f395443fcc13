"""Compile the Numba kernels a job will call into the on-disk cache, so that a new process (a
worker, the next `linstream embed`) loads them instead of compiling.

    warm_up(["builtin:default"], ["float64"])   # what `linstream warmup` runs

For each model (default: every built-in model) and state dtype this embeds a short chunk of zeros
with the numba backend twice: once with every kernel on its serial version and once on its
parallel one (a job picks either, by chunk length), which calls every kernel the model's forward
calls (the attention kernel at the model's head widths, the rule kernels of its rule layers and
their gather, the fused norm and activation passes) with the signatures a job's chunks have.
The kernels go to ``NUMBA_CACHE_DIR`` when it is set, else beside the package (or Numba's
per-user cache folder where the package's folder is read-only).  The container images run
`linstream warmup` at build time.  Numba's cache holds code for the CPU it was built on: a
machine with another CPU model compiles once per process, as without the cache (the job says
so in one line).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

# NumPy, Numba and the model are imported in the function that uses them: the command line
# imports this module for every `linstream` command.

__all__ = ["STATE_DTYPES", "warm_up"]

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
                        states: Any = model.initial_states(sdt)  # either model's own kind
                        model.embed_chunk(inputs, states, backend="numba")
            seconds = time.perf_counter() - t0
            what = f"{len(names)} function(s) compiled" if names else "all from the cache"
            lines.append(f"model {spec}, state {sdt}: {what} ({seconds:.1f} s)")
    return lines
