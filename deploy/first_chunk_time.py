"""Time from a fresh Python process's start to its first embedded chunk, as on a new worker.

    python deploy/first_chunk_time.py [--model builtin:default] [--backend numba] [--runs 3]

Each run starts a new interpreter that does what a worker's embed stage does before its first
output: import linstream (and Beam), build the step, `setup()` (load the model, compile or load
the Numba kernels), validate and apply one 64-token chunk.  The figure is the wall time from
spawning the interpreter to the chunk's embeddings, so it includes Python's own start-up.
Run it with an empty ``NUMBA_CACHE_DIR`` for a cold worker, and after ``linstream warmup``
(what the worker images run at build time) for a warm one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

_CHILD = """
import sys
import time
import apache_beam
beam_ready = time.time()
import numpy as np
from linstream.pipeline.stage.steps import EmbedStep
step = EmbedStep(sys.argv[1], backend=sys.argv[2])
step.setup()
cfg = step.model.config
data = step.validate(np.arange(64, dtype=np.int32) % cfg.vocab_size)
out, _ = step.apply(data, step.model.initial_states(step.state_dtype))
assert out.shape == (64, cfg.d_model)
print("first chunk", beam_ready, flush=True)
"""


def first_chunk_seconds(model: str, backend: str) -> tuple[float, float]:
    """(seconds to the first chunk, of which seconds to `import apache_beam`)."""
    t0 = time.perf_counter()
    wall0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, model, backend],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    if proc.wait() != 0 or "first chunk" not in line:
        msg = f"the timed process failed (exit {proc.returncode})"
        raise SystemExit(msg)
    return elapsed, float(line.split()[2]) - wall0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:default")
    p.add_argument("--backend", default="numba")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    runs = [first_chunk_seconds(a.model, a.backend) for _ in range(a.runs)]
    print(
        f"first chunk after {', '.join(f'{t:.2f}' for t, _ in runs)} s; of which Python start "
        f"and `import apache_beam` (a worker's harness has done it already): "
        f"{', '.join(f'{b:.2f}' for _, b in runs)} s "
        f"(model {a.model}, backend {a.backend}, NUMBA_CACHE_DIR="
        f"{os.environ.get('NUMBA_CACHE_DIR', '<default>')}, "
        f"NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', '<unset>')})"
    )


if __name__ == "__main__":
    main()
