"""The CuPy backend's algorithm and kernels, run on the CPU.

`scan_causal` is the code `cupy_causal` runs on the GPU, written against an array namespace: here
it runs with `xp=numpy`, once with the kernels as plain array code (`NumpyKernels`) and once with
the CUDA kernels themselves (`CupyKernels`) launched by the CPU emulator (tests/helpers/
cuda_emu.py: the CUDA source compiled as C++, every block and thread run), in forward and
reverse thread orders.  Both are compared with the float64 oracle over random chunk splits.  The
sources' NVRTC compilation is checked in tests/ops/test_cuda_nvrtc.py.

The helpers `make_case`, `run_split` and `assert_matches_oracle` are shared with
test_cupy_gpu.py, which runs the same assertions through `cupy_causal` on a device.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers.additive_cases import (
    FEATURE_MAPS,
    TOL,
    assert_matches_oracle,
    make_case,
    run_split,
    scan_fn,
    split_points,
)
from helpers.bf16 import bf16_round
from helpers.cuda_emu import EmuLauncher, compiler_missing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.additive import cupy_kernels as ck
from linstream.ops.additive.cupy import CupyKernels, NumpyKernels, cupy_causal, scan_causal
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import get_feature_map

# ---- the array code with NumPy ----------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(1, 150),
    h=st.integers(1, 3),
    dk=st.sampled_from([1, 3, 8, 16]),
    dv=st.sampled_from([1, 5, 16]),
    c=st.sampled_from([1, 2, 7, 16, 64]),
    n_splits=st.integers(0, 6),
    fmap=st.sampled_from(sorted(FEATURE_MAPS)),
    in_dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
)
def test_scan_numpy_matches_oracle_for_random_splits(
    seed, t, h, dk, dv, c, n_splits, fmap, in_dtype
):
    case = make_case(seed, t, h, dk, dv, fmap, in_dtype)
    bounds = split_points(case["rng"], t, n_splits)
    fn = scan_fn(NumpyKernels(np), case["fm"], in_dtype, c, 1e-6)
    out, state = run_split(fn, case, bounds)
    assert_matches_oracle(case, out, state, eps=1e-6, tol=TOL[in_dtype])


@pytest.mark.parametrize("max_block", [64, 1000], ids=["tiny-blocks", "small-blocks"])
def test_scan_numpy_blocks_of_a_long_call_carry_the_state(max_block):
    """One call longer than a work block runs in blocks of whole chunks; same result."""
    case = make_case(7, 300, 2, 8, 4, "elu+1", "float32")
    a = case["arrays"]
    out, state = scan_causal(
        a["q"],
        a["k"],
        a["v"],
        case["state"],
        feature_map=case["fm"],
        eps=1e-6,
        chunk_size=8,
        dtype=np.float32,
        xp=np,
        kernels=NumpyKernels(np),
        max_block_elements=max_block,
    )
    assert_matches_oracle(case, out, state, eps=1e-6, tol=2e-5)


def test_scan_keeps_a_float32_state_float32_and_never_mutates_inputs():
    case = make_case(3, 40, 2, 4, 3, "elu+1", "float32")
    s32 = AttentionState(case["state"].S.astype(np.float32), case["state"].z.astype(np.float32))
    case["state"] = s32
    before = {n: x.copy() for n, x in case["arrays"].items()}
    s_before = s32.copy()
    out, state = run_split(
        scan_fn(NumpyKernels(np), case["fm"], "float32", 16, 1e-6), case, [0, 40]
    )
    assert state.S.dtype == np.float32 and state.z.dtype == np.float32
    for n, x in case["arrays"].items():
        np.testing.assert_array_equal(x, before[n])
    np.testing.assert_array_equal(s32.S, s_before.S)
    assert_matches_oracle(case, out, state, eps=1e-6, tol=5e-5)


needs_cxx = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))


def emulated(schedule: int = 0) -> CupyKernels:
    """The CUDA kernels on the CPU emulator (0: threads and blocks in order, 1: reversed)."""
    return CupyKernels(EmuLauncher(schedule=schedule))


@needs_cxx
def test_worked_example_through_the_scan():
    keys = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])[:, None, :]
    values = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])[:, None, :]
    for kernels in (NumpyKernels(np), emulated()):
        out, state = scan_causal(
            keys,
            keys,
            values,
            AttentionState.zeros(1, 2, 2),
            feature_map=get_feature_map("identity"),
            eps=0.0,
            chunk_size=2,
            dtype=np.float64,
            xp=np,
            kernels=kernels,
        )
        np.testing.assert_allclose(out[:, 0], [[2.0, 0.0], [0.0, 3.0], [1.5, 0.5]], atol=1e-12)
        np.testing.assert_allclose(state.S[0], [[3.0, 1.0], [0.0, 3.0]], atol=1e-12)
        np.testing.assert_allclose(state.z[0], [2.0, 1.0], atol=1e-12)


# ---- the CUDA kernels, on the emulator -------------------------------------------------------


@needs_cxx
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(1, 70),
    h=st.integers(1, 2),
    dk=st.sampled_from([2, 5]),
    dv=st.sampled_from([3, 16]),  # 16 with c = 16 or 32: the register-tiled intra_norm
    c=st.sampled_from([4, 16, 32]),  # (few shapes: each is a kernel build, cached on disk)
    n_splits=st.integers(0, 3),
    fmap=st.sampled_from(sorted(FEATURE_MAPS)),
    in_dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
)
def test_emulated_kernels_match_oracle_for_random_splits(
    seed, t, h, dk, dv, c, n_splits, fmap, in_dtype
):
    """Forward and reverse thread and block orders give the same bits, within tol of the oracle."""
    case = make_case(seed, t, h, dk, dv, fmap, in_dtype)
    bounds = split_points(case["rng"], t, n_splits)
    print(f"seed={seed} T={t} C={c} dv={dv} {fmap} {in_dtype} bounds={bounds}")
    fns = [scan_fn(emulated(schedule), case["fm"], in_dtype, c, 1e-6) for schedule in (0, 1)]
    runs = [run_split(fn, case, bounds) for fn in fns]
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1].S, runs[1][1].S)
    assert_matches_oracle(case, *runs[1], eps=1e-6, tol=TOL[in_dtype])


@needs_cxx
@pytest.mark.parametrize("fmap", sorted(ck.FUSED_MAPS))
@pytest.mark.parametrize("in_dtype", ["float32", "float64", "bfloat16"])
def test_emulated_prep_equals_array_prep(fmap, in_dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((13, 3, 5))
    raw = bf16_round(x)[0] if in_dtype == "bfloat16" else x.astype(in_dtype)
    fm = get_feature_map(fmap)
    real = np.float64 if in_dtype == "float64" else np.float32
    for role in ("q", "k", "v"):
        got = emulated(1).prep(raw, in_dtype, fm, real, 16, role)
        want = NumpyKernels(np).prep(raw, in_dtype, fm, real, 16, role)
        assert got.shape == want.shape == (3, 16, 5 + (role == "v"))
        np.testing.assert_allclose(got, want, rtol=2 * np.finfo(real).eps, atol=0)  # exp's ulp
        assert not got[:, 13:].any(), "padding rows must be zero, even where φ(0) != 0"


@needs_cxx
@pytest.mark.parametrize(
    ("c", "dv", "t"),
    [(8, 4, 21), (16, 16, 40), (32, 16, 64), (64, 32, 100)],
    ids=["simple", "tiled-1x1", "tiled-2x1-full", "tiled-4x2"],
)
def test_emulated_intra_equals_array_intra(c, dv, t):
    assert ck.intra_tiled(c, dv) == (c % 16 == 0 and dv % 16 == 0)
    rng = np.random.default_rng(5)
    h = 2
    nch = -(-t // c)
    a = rng.standard_normal((h, nch, c, c))
    vx = np.concatenate([rng.standard_normal((h, nch * c, dv)), np.ones((h, nch * c, 1))], -1)
    inter = rng.standard_normal((h, nch * c, dv + 1))
    vx[:, t:] = 0  # padding rows, as prep writes them
    inter[..., dv] += 4.0 * c
    want = NumpyKernels(np).intra(a, vx, inter, 1e-6, t)
    for schedule in (0, 1):
        got = emulated(schedule).intra(a, vx, inter, 1e-6, t)
        assert got.shape == want.shape == (t, h, dv)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_cxx
@pytest.mark.parametrize("real", ["float32", "float64"])
def test_emulated_scan_equals_array_scan(real):
    rng = np.random.default_rng(8)
    ds = rng.standard_normal((3, 9, 4, 6)).astype(real)
    s0 = rng.standard_normal((3, 4, 6))
    pre, fin = emulated(1).scan(ds, s0, np.dtype(real))
    want_pre, want_fin = NumpyKernels(np).scan(ds, s0, np.dtype(real))
    assert pre.dtype == np.dtype(real) and fin.dtype == np.float64
    np.testing.assert_array_equal(pre, want_pre)  # the same float64 additions in the same order
    np.testing.assert_allclose(fin, want_fin, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(fin, s0 + ds.astype(np.float64).sum(axis=1), rtol=1e-13)


def test_bf16_bits_widen_exactly():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    bits, val = bf16_round(x)
    np.testing.assert_array_equal(x.astype(ml_dtypes.bfloat16).view(np.uint16), bits)
    np.testing.assert_array_equal(x.astype(ml_dtypes.bfloat16).astype(np.float32), val)


# ---- cupy_causal's own code (inputs, dtypes, where results live), on the emulator --------------


@pytest.fixture
def numpy_as_cupy():
    """cupy_causal with the emulator's launcher (NumPy arrays, the CUDA kernels run on the CPU)."""
    if compiler_missing() is not None:
        pytest.skip(str(compiler_missing()))
    launcher = EmuLauncher(schedule=1)
    return functools.partial(cupy_causal, launcher=launcher)


@pytest.mark.parametrize("form", ["float32", "float64", "bf16-bits", "ml_dtypes-bf16"])
def test_cupy_causal_inputs_and_results(numpy_as_cupy, form):
    from linstream.ops.additive.cupy import Bfloat16Bits

    in_dtype = "bfloat16" if "bf16" in form else form
    case = make_case(12, 45, 2, 16, 16, "elu+1", in_dtype)
    a = case["arrays"]
    if form == "bf16-bits":
        a = {n: Bfloat16Bits(x) for n, x in a.items()}
    elif form == "ml_dtypes-bf16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        a = {n: x.view(ml_dtypes.bfloat16) for n, x in a.items()}
    out, state = numpy_as_cupy(a["q"], a["k"], a["v"], case["state"], chunk_size=16)
    assert out.dtype == (np.float64 if form == "float64" else np.float32)
    assert state.S.dtype == np.float64
    assert_matches_oracle(case, out, state, eps=1e-6, tol=TOL[in_dtype])


def test_cupy_causal_empty_chunk_and_bad_dtype(numpy_as_cupy):
    st = AttentionState.zeros(2, 3, 4)
    out, new = numpy_as_cupy(np.zeros((0, 2, 3)), np.zeros((0, 2, 3)), np.zeros((0, 2, 4)), st)
    assert out.shape == (0, 2, 4)
    np.testing.assert_array_equal(new.S, st.S)
    x = np.zeros((3, 2, 3), np.int32)
    with pytest.raises(TypeError, match="q must be float32, float64 or bfloat16, got dtype int32"):
        numpy_as_cupy(x, x, x, st)
