"""The CuPy backend on a CUDA device: the same assertions as test_cupy_xp.py, through cupy_causal.

Skipped as a whole (the reason is printed by `-ra`) where CuPy sees no usable device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import additive_cases as cases
from helpers.bf16 import bf16_round
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.backend import cupy_unavailable_reason

_REASON = cupy_unavailable_reason()
if _REASON is not None:
    pytest.skip(f"CuPy GPU tests need a CUDA device: {_REASON}", allow_module_level=True)

import cupy as cp  # noqa: E402  (only importable as a device library past the skip)
from linstream.ops import causal_linear_attention  # noqa: E402
from linstream.ops.additive import cupy_kernels as ck  # noqa: E402
from linstream.ops.additive.cupy import (  # noqa: E402
    Bfloat16Bits,
    CupyKernels,
    NumpyKernels,
    cupy_causal,
)
from linstream.ops.attention_state import AttentionState  # noqa: E402
from linstream.ops.feature_maps import get_feature_map  # noqa: E402

pytestmark = pytest.mark.gpu


def _gpu_fn(fm: Any, in_dtype: str, c: int, eps: float, *, device: bool = False) -> Any:
    def fn(q: Any, k: Any, v: Any, state: AttentionState) -> Any:
        if in_dtype == "bfloat16":
            q, k, v = (Bfloat16Bits(cp.asarray(x) if device else x) for x in (q, k, v))
        elif device:
            q, k, v = cp.asarray(q), cp.asarray(k), cp.asarray(v)
        out, new = cupy_causal(q, k, v, state, feature_map=fm, eps=eps, chunk_size=c)
        return (cp.asnumpy(out) if device else out), new

    return fn


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(1, 300),
    h=st.integers(1, 4),
    dk=st.sampled_from([1, 3, 16, 64]),
    dv=st.sampled_from([1, 5, 64]),
    c=st.sampled_from([1, 7, 16, 64, 128]),
    n_splits=st.integers(0, 6),
    fmap=st.sampled_from(sorted(cases.FEATURE_MAPS)),
    in_dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
    device=st.booleans(),
)
def test_cupy_matches_oracle_for_random_splits(
    seed, t, h, dk, dv, c, n_splits, fmap, in_dtype, device
):
    case = cases.make_case(seed, t, h, dk, dv, fmap, in_dtype)
    bounds = cases.split_points(case["rng"], t, n_splits)
    out, state = cases.run_split(
        _gpu_fn(case["fm"], in_dtype, c, 1e-6, device=device), case, bounds
    )
    assert isinstance(state.S, np.ndarray), "a host state must come back on the host"
    cases.assert_matches_oracle(case, out, state, eps=1e-6, tol=cases.TOL[in_dtype])


def test_device_inputs_and_state_stay_on_the_device():
    case = cases.make_case(1, 200, 4, 64, 64, "elu+1", "float32")
    a = case["arrays"]
    st0 = AttentionState(cp.asarray(case["state"].S), cp.asarray(case["state"].z))
    out, st1 = cupy_causal(cp.asarray(a["q"]), cp.asarray(a["k"]), cp.asarray(a["v"]), st0)
    assert isinstance(out, cp.ndarray) and isinstance(st1.S, cp.ndarray)
    assert st1.S.dtype == np.float64
    host = AttentionState(cp.asnumpy(st1.S), cp.asnumpy(st1.z))
    cases.assert_matches_oracle(case, cp.asnumpy(out), host, eps=1e-6, tol=2e-5)


def test_public_api_with_backend_cupy():
    case = cases.make_case(2, 500, 8, 64, 64, "elu+1", "float32")
    a = case["arrays"]
    out, state = causal_linear_attention(
        a["q"], a["k"], a["v"], case["state"], feature_map="elu+1", backend="cupy"
    )
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    cases.assert_matches_oracle(case, out, state, eps=1e-6, tol=2e-5)


def test_ml_dtypes_bfloat16_is_accepted():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    case = cases.make_case(4, 100, 2, 16, 8, "elu+1", "bfloat16")
    a = {n: x.view(ml_dtypes.bfloat16) for n, x in case["arrays"].items()}
    out, state = cupy_causal(a["q"], a["k"], a["v"], case["state"], chunk_size=32)
    cases.assert_matches_oracle(case, out, state, eps=1e-6, tol=2e-5)


def test_long_call_against_the_oracle():
    case = cases.make_case(9, 2048, 2, 64, 64, "elu+1", "float32")
    out, state = cases.run_split(_gpu_fn(case["fm"], "float32", 64, 1e-6), case, [0, 1000, 2048])
    cases.assert_matches_oracle(case, out, state, eps=1e-6, tol=2e-5)


@pytest.mark.parametrize("fmap", sorted(ck.FUSED_MAPS))
@pytest.mark.parametrize("in_dtype", ["float32", "float64", "bfloat16"])
def test_prep_kernel_equals_the_array_code(fmap, in_dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((77, 3, 64))
    raw = bf16_round(x)[0] if in_dtype == "bfloat16" else x.astype(in_dtype)
    fm = get_feature_map(fmap)
    for role in ("q", "k", "v"):
        got = CupyKernels().prep(cp.asarray(raw), in_dtype, fm, np.float32, 128, role)
        want = NumpyKernels(np).prep(raw, in_dtype, fm, np.float32, 128, role)
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=2e-7, atol=0)


@pytest.mark.parametrize("real", ["float32", "float64"])
@pytest.mark.parametrize(("c", "dv", "t"), [(64, 64, 1000), (16, 5, 33), (128, 128, 300)])
def test_intra_kernel_equals_the_array_code(real, c, dv, t):
    rng = np.random.default_rng(5)
    h = 3
    nch = -(-t // c)
    a = rng.standard_normal((h, nch, c, c)).astype(real)
    vx = np.concatenate([rng.standard_normal((h, nch * c, dv)), np.ones((h, nch * c, 1))], -1)
    vx = vx.astype(real)
    inter = rng.standard_normal((h, nch * c, dv + 1)).astype(real)
    inter[..., dv] += 4.0 * c
    got = CupyKernels().intra(cp.asarray(a), cp.asarray(vx), cp.asarray(inter), 1e-6, t)
    want = NumpyKernels(np).intra(a, vx, inter, 1e-6, t)
    tol = 1e-5 if real == "float32" else 1e-12
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("real", ["float32", "float64"])
def test_scan_kernel_equals_the_array_code(real):
    rng = np.random.default_rng(8)
    ds = rng.standard_normal((4, 300, 64, 65)).astype(real)
    s0 = rng.standard_normal((4, 64, 65)) * 100
    pre, fin = CupyKernels().scan(cp.asarray(ds), cp.asarray(s0), np.dtype(real))
    want_pre, want_fin = NumpyKernels(np).scan(ds, s0, np.dtype(real))
    np.testing.assert_array_equal(cp.asnumpy(pre), want_pre)  # same float64 adds, same order
    np.testing.assert_allclose(cp.asnumpy(fin), want_fin, rtol=1e-14, atol=1e-14)
