"""The rule kernels on a CUDA device: the checks of test_rules_cupy_emu.py through the current
device's launcher, at the emulated shapes and at model shapes the emulator is too slow for.

Skipped as a whole (the reason is printed by `-ra`) where CuPy sees no usable device.  Run on a
device by `make gpu-check`'s script too (tests/gpu/gpu_check.py), which adds the throughput.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rule_kernels import RULES, error, heads, make_case, reference, run_split, tolerance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.backend import cupy_unavailable_reason

_REASON = cupy_unavailable_reason()
if _REASON is not None:
    pytest.skip(f"rule GPU tests need a CUDA device: {_REASON}", allow_module_level=True)

import cupy as cp  # noqa: E402  (only importable as a device library past the skip)
from linstream.ops.cuda import Bfloat16Bits  # noqa: E402
from linstream.ops.decay.cupy import decay_chunks  # noqa: E402
from linstream.ops.feature_maps import get_feature_map  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"f64-state64": (np.float64, np.float64), "f32-state64": (np.float32, np.float64),
          "f32-state32": (np.float32, np.float32)}  # fmt: skip


def check_device(case, bounds, c, cdt, sdt) -> None:
    """Two runs give the same bits (the kernels are deterministic: a difference is a race) and
    match the reference within the derived tolerance."""
    runs = [run_split(case, bounds, impl="cupy", c=c, cdt=cdt, sdt=sdt) for _ in range(2)]
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b, err_msg="two runs differ: a race")
    ref = reference(case)
    tol = tolerance(case, ref, c=c, n_calls=len(bounds) - 1, cdt=cdt, sdt=sdt)
    for what, e, t in zip(("out", "S", "z"), error(runs[0], ref), tol, strict=True):
        assert e <= t, f"{case.rule} {what}: error {e:.3g} > tolerance {t:.3g}"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtypes", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("rule", RULES)
def test_random_splits_match_the_reference(rule, dtypes, seed):
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 1500))
    h = int(rng.integers(1, 5))
    dk = int(rng.choice([1, 3, 16, 64, 128]))
    dv = int(rng.choice([1, 5, 20, 64, 128]))
    c = int(rng.choice([1, 7, 16, 32, 64]))
    bounds = sorted({0, t, *rng.integers(0, t + 1, size=int(rng.integers(0, 5))).tolist()})
    print(f"seed={seed} rule={rule} {dtypes} T={t} H={h} dk={dk} dv={dv} C={c} bounds={bounds}")
    check_device(make_case(rule, seed, t, h, dk, dv), bounds, c, *DTYPES[dtypes])


@pytest.mark.parametrize("rule", RULES)
def test_model_shapes(rule):
    """d_k = 128 or 256 and d_v = 256 (GLA / Gated DeltaNet at 1.3B), 2,048-token calls."""
    dk = 256 if rule == "vector" else 128
    case = make_case(rule, 11, 4096, 4, dk, 256)
    check_device(case, [0, 2048, 4096], 64, np.float32, np.float64)


@pytest.mark.parametrize("rule", ["gated", "vector", "gated_delta"])
def test_bfloat16_inputs_give_the_float32_results_of_their_values(rule):
    case = make_case(rule, 21, 700, 3, 64, 64)
    bits = run_split(case, [0, 300, 700], impl="cupy", c=64, form="bf16-bits")
    values = run_split(case, [0, 300, 700], impl="cupy", c=64, form="bf16-values")
    for a, b in zip(bits, values, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rule", ["gated", "vector", "gated_delta"])
def test_agrees_with_the_numba_kernel(rule):
    """The same chunk boundaries and float64 gate sums: within float32 rounding of Numba's."""
    case = make_case(rule, 5, 1000, 2, 64, 64)
    got = run_split(case, [0, 333, 1000], impl="cupy", c=64)
    want = run_split(case, [0, 333, 1000], impl="numba", c=64)
    ref = reference(case)
    tol = tolerance(case, ref, c=64, n_calls=2)
    for e, t in zip(error(got, want), tol, strict=True):
        assert e <= 2 * t


def test_device_arrays_stay_on_the_device():
    """CuPy inputs and state in: a CuPy output, the CuPy state updated in place (the arrays a
    model keeps on the device); the same numbers as NumPy in and out."""
    case = make_case("gated", 3, 200, 2, 16, 16)
    ref = run_split(case, [0, 200], impl="cupy", c=32)
    fm = get_feature_map("elu+1")
    qh, kh = (cp.asarray(heads(x, fm, np.float32)) for x in (case.q, case.k))
    vh = cp.asarray(heads(case.v, None, np.float32, ones=True))
    sx = cp.asarray(np.concatenate([case.s0, case.z0[..., None]], axis=-1))
    eps_t = cp.full((2, 200), 1e-6)
    out = decay_chunks(qh, kh, vh, sx, cp.asarray(case.log_alpha.T), eps_t, normalize=True,
                       chunk_size=32)  # fmt: skip
    assert isinstance(out, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(out).transpose(1, 0, 2), ref[0])
    np.testing.assert_array_equal(cp.asnumpy(sx)[..., :-1], ref[1])
    bits = Bfloat16Bits(cp.zeros((2, 200, 16), dtype=cp.uint16))
    ones = Bfloat16Bits(cp.zeros((2, 200, 17), dtype=cp.uint16))
    zero = decay_chunks(bits, bits, ones, cp.zeros((2, 16, 17)), cp.zeros((2, 200)), eps_t,
                        normalize=True, chunk_size=32)  # fmt: skip
    assert isinstance(zero, cp.ndarray) and zero.dtype == cp.float32
