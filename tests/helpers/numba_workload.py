"""Call every jitted kernel of linstream.ops once and print, as one JSON line, what Numba compiled.

    PYTHONPATH=tests python tests/helpers/numba_workload.py

Run as a fresh process (the cross-process cache tests run it twice on one NUMBA_CACHE_DIR).
"Compiled" is Numba's own evidence: its `numba:compile` event fires only when a dispatcher
compiles a signature, never when it loads one from the on-disk cache.  The printed object:
    {"compiled": ["module:qualified name" of each function compiled, in order], "seconds": ...}
(Numba's own helpers compiled on the way, such as `np.empty`'s, are listed too.)
The calls cover the additive kernel's serial and parallel versions (two head widths, both
compute dtypes, both state dtypes), the four rules (decay, gated, delta, gated_delta) with the
gather's serial and parallel versions, the model's fused passes (serial and parallel), the
vector-gated kernel, an embed through a tiny fla-format model folder of each family (GLA,
RetNet, DeltaNet, Gated DeltaNet, HGRN2, RWKV-7: the fla runtime's fused passes and the DPLR
kernel, serial and parallel), the bfloat16 mode's MLP passes (the fused kernels compiled for a
bfloat16 output) and the float64 recurrent oracle.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from numba.core import event

compiled: list[str] = []


class _Compiles(event.Listener):
    def on_start(self, ev: event.Event) -> None:
        fn = ev.data["dispatcher"].py_func
        compiled.append(f"{fn.__module__}:{fn.__qualname__}")

    def on_end(self, ev: event.Event) -> None:
        pass


event.register("numba:compile", _Compiles())

t0 = time.perf_counter()

import numpy as np  # noqa: E402  (after the listener, so that nothing compiles unseen)
from linstream.ops import causal_linear_attention  # noqa: E402
from linstream.ops.additive.naive_numba import recurrent_float64  # noqa: E402
from linstream.ops.decay.vector_numba import vector_gated_chunks  # noqa: E402
from linstream.ops.model.fla import fused, load_model  # noqa: E402
from linstream.ops.model.kernels import NumbaOps  # noqa: E402
from linstream.ops.numba_tools import only_version  # noqa: E402

from helpers.fla_folders import TINY_CONFIGS, write_folder  # noqa: E402  (PYTHONPATH=tests)

rng = np.random.default_rng(0)


def qkv(t: int, h: int, d: int, dt: type) -> list[np.ndarray]:
    return [rng.standard_normal((t, h, d)).astype(dt) for _ in range(3)]


# additive: (T, H, d) small (serial) and large enough for the parallel version
for t, h, d in ((8, 2, 8), (512, 2, 64)):
    for compute in (np.float32, np.float64):
        q, k, v = qkv(t, h, d, compute)
        causal_linear_attention(q, k, v, backend="numba")
    q, k, v = qkv(t, h, d, np.float32)
    causal_linear_attention(q, k, v, backend="numba", state_dtype=np.float32)
    causal_linear_attention(q, k, v, backend="numba", feature_map="relu")

# the rules, on a small chunk (serial gather) and a long one (parallel gather)
for t in (8, 1024):
    q, k, v = qkv(t, 2, 32, np.float32)
    gate = np.full((t, 2), -0.1)
    beta = np.full((t, 2), 0.5)
    causal_linear_attention(q, k, v, backend="numba", rule="decay", gamma=0.9)
    causal_linear_attention(q, k, v, backend="numba", rule="gated", log_alpha=gate)
    causal_linear_attention(q, k, v, backend="numba", rule="delta", beta=beta)
    causal_linear_attention(q, k, v, backend="numba", rule="gated_delta", log_alpha=gate, beta=beta)

# the model's fused passes: a small chunk (serial) and a large one (parallel)
ops = NumbaOps(1e-5)
for rows, width in ((4, 16), (2048, 128)):
    x = rng.standard_normal((rows, width)).astype(np.float32)
    w = np.ones(width, np.float32)
    b = np.zeros(width, np.float32)
    ops.norm(x, (w, b))
    ops.norm(x, (w, None))
    ops.add_norm(x.copy(), x, b, (w, b))
    ops.bias_act(x.copy(), b, "gelu_tanh")

# the vector-gated kernel, both compute dtypes and both state dtypes
for compute, state in (
    (np.float32, np.float32),
    (np.float32, np.float64),
    (np.float64, np.float64),
):
    qh, kh, vh = (rng.standard_normal((2, 40, 8)).astype(compute) for _ in range(3))
    gh = -rng.exponential(0.2, size=(2, 40, 8)).astype(compute)
    vector_gated_chunks(qh, kh, vh, gh, np.zeros((2, 8, 8), state), chunk_size=16)

# an embed through a tiny fla-format folder of each family, serial and parallel passes
with tempfile.TemporaryDirectory() as folder:
    for family, config in TINY_CONFIGS.items():
        model = load_model(write_folder(Path(folder) / family, config))
        for parallel in (False, True):
            with only_version(parallel):
                model.embed_chunk(np.arange(40) % 50, model.initial_states())

# the bfloat16 mode's MLP passes: the fused kernels' versions that write bfloat16
for parallel in (False, True):
    with only_version(parallel):
        g = rng.standard_normal((8, 16)).astype(np.float32)
        fused.swiglu(g, g, rounded=True)
        fused.add_rms_norm(g, g, np.ones(16, np.float32), 1e-5, rounded=True)

# the float64 oracle
q, k, v = qkv(16, 2, 8, np.float64)
recurrent_float64(q, k, v)

print(json.dumps({"compiled": compiled, "seconds": round(time.perf_counter() - t0, 2)}))
