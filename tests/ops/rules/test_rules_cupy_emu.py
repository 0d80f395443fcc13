"""The rule kernels' CUDA source (ops/decay/cupy_kernels.py, vector_cupy_kernels.py,
ops/delta/cupy_kernels.py) run on the CPU by the emulator (tests/helpers/cuda_emu.py: the source
compiled as C++, every block and thread of the launch run, shared memory poisoned, arrays
guarded), through the same Python wrappers a device runs.

Each case runs in forward and in reverse thread and block order: the two must give the same bits
(an order-dependent result is a race) and match the float64 token-by-token reference within the
derived tolerance of tests/helpers/rule_kernels.py, over random splits into calls and random chunk
lengths (Hypothesis draws a seed; seed, shapes and splits are printed).  Then what a device run
must also keep: bfloat16 inputs give exactly the float32 results of their values; non-finite
inputs and erasing gates end chunks as the Numba kernels do; a device with little shared memory
runs shorter chunks; inputs and results live where the caller put them.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.cuda_emu import EmuLauncher, compiler_missing
from helpers.rule_kernels import (
    KERNEL_OF,
    RULES,
    check_emulated,
    error,
    make_case,
    reference,
    run_split,
    tolerance,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.decay import cupy_kernels as decay_k
from linstream.ops.decay import vector_cupy_kernels as vector_k
from linstream.ops.decay.cupy import decay_chunks
from linstream.ops.decay.vector_cupy import vector_gated_chunks
from linstream.ops.delta import cupy_kernels as delta_k
from linstream.ops.delta.cupy import delta_chunks

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))

DTYPES = {"f64-state64": (np.float64, np.float64), "f32-state64": (np.float32, np.float64),
          "f32-state32": (np.float32, np.float32)}  # fmt: skip


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtypes", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("rule", RULES)
def test_random_splits_match_the_reference(rule, dtypes, seed):
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 301))
    h = int(rng.integers(1, 4))
    dk = int(rng.choice([1, 3, 8, 16, 64]))
    dv = int(rng.choice([1, 5, 16, 20, 64]))  # 20: a full and a 4-column value tile
    c = int(rng.choice([1, 7, 16, 64]))
    n_splits = int(rng.integers(0, 4))
    bounds = sorted({0, t, *rng.integers(0, t + 1, size=n_splits).tolist()})
    print(f"seed={seed} rule={rule} {dtypes} T={t} H={h} dk={dk} dv={dv} C={c} bounds={bounds}")
    case = make_case(rule, seed, t, h, dk, dv)
    cdt, sdt = DTYPES[dtypes]
    check_emulated(case, bounds, c=c, cdt=cdt, sdt=sdt)


@pytest.mark.parametrize("rule", ["gated", "vector", "gated_delta"])
def test_bfloat16_inputs_give_the_float32_results_of_their_values(rule):
    """bfloat16 widens exactly, then the same float32 math: the same bits as float32 inputs."""
    case = make_case(rule, 21, 90, 2, 16, 20)
    runs = {
        form: run_split(case, [0, 40, 90], impl="cupy", c=16, launcher=EmuLauncher(1), form=form)
        for form in ("bf16-bits", "bf16-values", "plain")
    }
    for a, b in zip(runs["bf16-bits"], runs["bf16-values"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(runs["bf16-bits"][0], runs["plain"][0]), "nothing was rounded"


@pytest.mark.parametrize("bad", ["nan-value", "inf-key", "erasing-gate"])
@pytest.mark.parametrize("rule", ["gated", "vector", "gated_delta"])
def test_non_finite_inputs_and_erasing_gates_end_chunks_as_in_numba(rule, bad):
    """A NaN value or Inf key at token 21 of a 32-token chunk: the earlier tokens' outputs stay
    finite (the chunk ends before it, as in the Numba kernel), later ones are NaN as there; an
    erasing gate (-inf, floored) there leaves everything finite and equal to Numba's."""
    case = make_case(rule, 5, 60, 2, 8, 6)
    if bad == "nan-value":
        case.v[21, 1, 2] = np.nan
    elif bad == "inf-key":
        case.k[21, 0, 3] = np.inf
    else:
        case.log_alpha[21, 1] = -np.inf
    got = run_split(case, [0, 60], impl="cupy", c=32, launcher=EmuLauncher(1))
    want = run_split(case, [0, 60], impl="numba", c=32)
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want[0]))
    assert np.isfinite(got[0][:21]).all()
    ref = reference(case) if bad == "erasing-gate" else None
    if ref is not None:
        assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all()
        tol = tolerance(case, ref, c=32, n_calls=1)
        assert error(got, ref)[0] <= tol[0]
    fin = np.isfinite(want[0])
    np.testing.assert_allclose(got[0][fin], want[0][fin], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule", ["decay", "vector", "delta"])
def test_little_shared_memory_runs_shorter_chunks(rule):
    """At the 48 KiB a block gets without opting in, 64-token chunks of 64 features do not fit:
    the wrapper launches shorter ones, and the results still match the reference."""
    case = make_case(rule, 8, 150, 2, 64, 20)
    launcher = EmuLauncher(1, max_shared=48 * 1024)
    check_emulated(case, [0, 150], c=64, max_shared=48 * 1024)
    run_split(case, [0, 150], impl="cupy", c=64, launcher=launcher)
    (kern,) = launcher._kernels.values()
    full = {"decay": decay_k.decay_shared_bytes(64, 64, 4, 8),
            "vector": vector_k.vector_shared_bytes(64, 64, 4),
            "delta": delta_k.delta_shared_bytes(64, 64, 4)}  # fmt: skip
    assert full[rule] > 48 * 1024
    assert all(la["shared_mem"] <= 48 * 1024 for la in kern.launches)
    assert kern.launches[0]["grid"] == (2, 2) and kern.launches[0]["block"] == (256,)


def test_features_too_wide_for_any_chunk_say_so():
    case = make_case("decay", 1, 10, 1, 4000, 3)
    with pytest.raises(ValueError, match=r"decay_chunks: one block needs \d+ bytes of shared"):
        run_split(case, [0, 10], impl="cupy", c=64, launcher=EmuLauncher())


def _empty_call(family: str, s: np.ndarray) -> np.ndarray:
    h, f, w = s.shape
    x = np.zeros((h, 0, f), np.float32)
    per_token = np.zeros((h, 0))
    lau = EmuLauncher()
    if family == "decay_chunks":
        v = np.zeros((h, 0, w), np.float32)
        return decay_chunks(x, x, v, s, per_token, per_token, normalize=True, chunk_size=8,
                            launcher=lau)  # fmt: skip
    v = np.zeros((h, 0, w), np.float32)
    if family == "delta_chunks":
        return delta_chunks(x, x, v, s, per_token, per_token, chunk_size=8, launcher=lau)
    return vector_gated_chunks(x, x, v, x, s, chunk_size=8, launcher=lau)


@pytest.mark.parametrize("rule", ["gated", "vector", "delta"])
def test_empty_calls_and_where_results_live(rule):
    """T = 0 returns an empty output and leaves the state; NumPy inputs give NumPy results, and
    the given state array is the one updated (in place, as the Numba kernels do)."""
    family = KERNEL_OF[rule]
    s = np.full((2, 4, 4 if family == "decay_chunks" else 3), 7.0)
    out = _empty_call(family, s)
    assert isinstance(out, np.ndarray) and out.shape == (2, 0, 3) and (s == 7).all()
    case = make_case(rule, 2, 12, 2, 4, 3)
    got = run_split(case, [0, 12], impl="cupy", c=8, launcher=EmuLauncher())  # reads the state
    ref = reference(case)  # back from the array it gave the kernel: updated there, or stale
    assert error(got, ref)[1] <= tolerance(case, ref, c=8, n_calls=1)[1]


def test_mixed_input_dtypes_are_refused_in_one_line():
    q = np.zeros((1, 4, 3), np.float32)
    v = np.zeros((1, 4, 4), np.float32)
    per_token = np.zeros((1, 4))
    with pytest.raises(TypeError, match="must share one dtype, got qh float32, kh float64, vh"):
        decay_chunks(q, q.astype(np.float64), v, np.zeros((1, 3, 4)), per_token, per_token,
                     normalize=True, chunk_size=4, launcher=EmuLauncher())  # fmt: skip


def test_one_feature_keeps_z():
    """F = 1 (a one-column key): z's copy before the launch must be a copy.  It was a view of the
    state (ascontiguousarray keeps a view where the other axes have size 1), so tile 0 wrote
    the final z where the other tiles' blocks read their starting z: a race on a device.  The
    emulator found it (its reference check first; now it refuses the overlapping arguments)."""
    case = make_case("gated", 71761, 84, 1, 1, 20)
    check_emulated(case, [0, 10, 38, 84], c=16, cdt=np.float64, sdt=np.float64)
