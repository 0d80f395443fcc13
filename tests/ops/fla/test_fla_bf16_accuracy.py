"""The bfloat16 mode's error against fla's float32 forward, per family: what a user comparing
`load_model(folder, compute_dtype="bfloat16")` with fla's model (from_pretrained in float32 on
the same bfloat16 checkpoint) sees, for both of the mode's product engines.

Each of fla's tiny models (tests/helpers/fla_oracle.py: every family and option the runtime
implements) is saved in bfloat16 and run by fla in float32 (F32), in float64 (F64), and in
float64 with the input of every matrix product rounded to bfloat16 (R).  L is linstream's
bfloat16 mode over a stream of three pieces.  Printed per family: rms(L − F32) as a share of the
hidden states' rms, and the largest difference.

Tolerances, derived from two facts the other tests establish:

- "widen" (CPUs without bfloat16 instructions): L is the float32 mode's bits on unpacked
  weights (test_fla_bf16.py), which stay within 8 · e32 of F64 in every hidden state
  (test_fla_oracle.py: fla's own float32 error e32 = max|F32 − F64|, times 8 for another
  summation order; packed and unpacked products differ only in their sums' order).  So
  max|L − F32| ≤ max|L − F64| + max|F64 − F32| ≤ (8 + 1) · e32.  Fails when the mode rounds
  anything (its error is then the rounding's, ~1e3 × e32 here).
- "mkl" (the CPU's bfloat16 instructions; forced here, where MKL widens itself): every product's
  input rounded to bfloat16, so rms(L − F64) lies in [0.75, 1.25] · rms(R − F64)
  (test_fla_bf16.py says why), and rms(F32 − F64) = e moves that by at most e against F32:
  0.75 · r − e ≤ rms(L − F32) ≤ 1.25 · r + e with r = rms(R − F64).  The lower bound fails when
  nothing is rounded, the upper when more is (outputs, weights) or the arithmetic is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fla", reason="flash-linear-attention is a test extra (make test installs it)")

from helpers.fla_oracle import build_and_save, run_fla, tiny_configs  # noqa: E402
from helpers.streaming import stream_hidden_states, worst  # noqa: E402
from linstream.ops.model.fla import load_model  # noqa: E402

pytestmark = pytest.mark.e2e  # fla's models: `make check` leaves it out

SEED = 20261204
T = 100
BOUNDS = [0, 37, 38, T]
ENV = "LINSTREAM_BF16_PRODUCTS"
FACTOR = 8  # test_fla_oracle.py's factor for another summation order


def rms(a, b) -> float:
    d = np.concatenate([(np.asarray(x, np.float64) - y).ravel() for x, y in zip(a, b, strict=True)])
    return float(np.sqrt(np.mean(d * d)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fla_bf16_accuracy")
    ids = np.random.default_rng(SEED).integers(0, 128, T)
    print(f"token seed={SEED}")
    cache: dict = {}

    def get(name):
        if name not in cache:
            folder = build_and_save(name, tiny_configs()[name], root, dtype=torch.bfloat16)
            cache[name] = (
                folder,
                ids,
                run_fla(folder, ids, torch.float32),
                run_fla(folder, ids, torch.float64),
                run_fla(folder, ids, torch.float64, linear_inputs=torch.bfloat16),
            )
        return cache[name]

    return get


@pytest.mark.parametrize("engine", ["widen", "mkl"])
@pytest.mark.parametrize("name", list(tiny_configs()))
def test_bfloat16_mode_against_fla_float32(runs, name, engine, monkeypatch):
    folder, ids, f32, f64, rounded = runs(name)
    monkeypatch.setenv(ENV, engine)
    hs, _ = stream_hidden_states(load_model(folder, compute_dtype="bfloat16"), ids, BOUNDS)
    scale = rms(f32, [np.zeros_like(h) for h in f32])
    err, big = rms(hs, f32), worst(hs, f32)
    e32, e = worst(f32, f64), rms(f32, f64)
    print(
        f"{name} ({engine}): rms error against fla float32 {err:.3g} ({err / scale:.2g} of the "
        f"hidden states' rms {scale:.3g}), largest {big:.3g}; fla float32's own against float64 "
        f"rms {e:.3g}, largest {e32:.3g}"
    )
    if engine == "widen":
        assert big <= (FACTOR + 1) * e32
    else:
        r = rms(rounded, f64)
        assert 0.75 * r - e <= err <= 1.25 * r + e, (err, r, e)
