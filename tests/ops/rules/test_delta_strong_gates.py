"""The delta rules' Numba kernel under strong gates (a trained model's fast-forgetting heads):
decay factors below the flush and the solve's terms below its square root are zeros, not the
subnormal numbers they would be (`ops/delta/numba.py`), and leaving them out keeps the outputs
and the state within the rules' derived float32 bound of the float64 token-by-token reference
(helpers.rule_kernels.tolerance: the dropped terms are below e^-30 of the terms kept, far under
one rounding).  The speed this buys is benchmarked in tests/bench/test_bench_strong_decays.py."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rule_kernels import error, make_case, reference, run_split, tolerance

SEED = 20261205


@pytest.mark.parametrize("log_gate", [-3.0, -20.0])
@pytest.mark.parametrize("sdt", [np.float32, np.float64])
def test_strong_gates_stay_within_the_float32_bound(log_gate, sdt):
    print(f"seed={SEED}")
    case = make_case("gated_delta", seed=SEED, t=300, h=2, dk=16, dv=12)
    rng = np.random.default_rng(SEED)
    jitter = rng.uniform(0.5, 1.5, case.log_alpha.shape)
    case.log_alpha = np.asarray(log_gate * jitter, np.float32).astype(np.float64)
    ref = reference(case)
    got = run_split(case, [0, 130, 300], impl="numba", c=64, sdt=sdt)
    bounds = tolerance(case, ref, c=64, n_calls=2, sdt=sdt)
    errs = error(got, ref)
    print(dict(zip(("out", "S", "z"), zip(errs, bounds, strict=True), strict=True)))
    assert errs[0] <= bounds[0] and errs[1] <= bounds[1]
    assert np.abs(ref[0]).max() > 100 * bounds[0]  # the outputs are not all below the bound
