"""The SSD kernels' CUDA source (ops/ssd/cupy_kernels.py) run on the CPU by the emulator
(tests/helpers/cuda_emu.py: the source compiled as C++, every block and thread of the launch
run, shared memory poisoned, arrays guarded), through the wrapper a device runs (ops/ssd/cupy.py).

Each case runs in forward and in reverse thread and block order: the two must give the same bits
(an order-dependent result is a race) and stay within the derived tolerance of transformers'
float64 scan (tests/helpers/ssd_cases.py), over random splits into calls and random chunk
lengths (Hypothesis draws a seed; seed, shapes and splits are printed); the Numba kernel, within
the same tolerance of the same reference, is then within twice it of the CUDA kernel.  Then what
a device run must also keep: bfloat16 inputs give exactly the float32 results of their values;
a non-finite input starts a chunk as in the Numba kernel; erasing decays give no NaN; a device
with little shared memory runs shorter chunks; results live where the caller put them.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.bf16 import bf16_round
from helpers.cuda_emu import EmuLauncher, compiler_missing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.cuda import Bfloat16Bits
from linstream.ops.ssd import cupy_kernels as sk
from linstream.ops.ssd.cupy import ssd_chunks

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))
pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is a test extra (make test installs it)")

from helpers.ssd_cases import case, streamed, tolerances, worst  # noqa: E402

DTYPES = {"f64-state64": (np.float64, np.float64), "f32-state64": (np.float32, np.float64),
          "f32-state32": (np.float32, np.float32)}  # fmt: skip
INF = (0.0, float("inf"))


def emulated(schedule: int, **kw):
    """ssd_chunks on an emulator launcher (the kernel argument of `streamed`)."""
    lau = EmuLauncher(schedule, **kw)

    def run(*args, **kwargs):
        return ssd_chunks(*args, **kwargs, launcher=lau)

    run.launcher = lau  # type: ignore[attr-defined]
    return run


def check(kw, limit, bounds, cdt, sdt, chunk, **launcher_kw):
    """Forward and reverse order give the same bits, within the derived tolerance of the
    reference; the Numba kernel within twice it.  Returns the forward run."""
    runs = [
        streamed(kw, limit, bounds, cdt, sdt, chunk, emulated(s, **launcher_kw)) for s in (0, 1)
    ]
    for a, b in zip(runs[0], runs[1], strict=True):
        assert np.array_equal(a, b, equal_nan=True), "forward and reverse order differ (a race)"
    y, s = runs[0]
    assert y.dtype == cdt and s.dtype == sdt
    ref = tolerances(kw, limit, cdt, sdt)
    err, err_s = worst(y, ref["y64"]), worst(s, ref["s64"])
    print(f"error {err:.3g} (tol {ref['tol']:.3g}), state {err_s:.3g} ({ref['tol_s']:.3g})")
    assert err <= ref["tol"] and err_s <= ref["tol_s"]
    yn, sn = streamed(kw, limit, bounds, cdt, sdt, chunk)
    assert worst(y, yn) <= 2 * ref["tol"] and worst(s, sn) <= 2 * ref["tol_s"]
    return runs[0]


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtypes", list(DTYPES), ids=list(DTYPES))
def test_random_splits_match_transformers_scan_and_numba(dtypes, seed):
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 120))
    g, hpg = int(rng.choice([1, 2])), int(rng.integers(1, 3))
    p, n = int(rng.choice([4, 8, 20])), int(rng.choice([4, 16]))  # 20: a full and a 4-row tile
    chunk = int(rng.choice([1, 7, 16, 64]))
    limit = INF if rng.random() < 0.5 else (0.05, float(rng.uniform(0.1, 2.0)))
    cuts = rng.integers(1, t, size=int(rng.integers(0, 4))).tolist() if t > 1 else []
    bounds = sorted({0, t, *cuts})
    print(f"seed={seed} T={t} G={g} H={g * hpg} P={p} N={n} C={chunk} limit={limit} {bounds}")
    check(case(rng, t, g, hpg, p, n), limit, bounds, cdt, sdt, chunk)


def test_bfloat16_inputs_give_the_float32_results_of_their_values():
    """bfloat16 widens exactly, then the same float32 math: the same bits as float32 inputs."""
    kw = case(np.random.default_rng(21), 70, 2, 2, 8, 16)
    for name in ("x", "b", "c"):
        kw[name] = bf16_round(kw[name])[1].astype(np.float64)  # values bfloat16 holds exactly
    bits = streamed(kw, INF, [0, 30, 70], np.float32, np.float64, 16, emulated(1),
                    convert=lambda v: Bfloat16Bits(bf16_round(v)[0]))  # fmt: skip
    vals = streamed(kw, INF, [0, 30, 70], np.float32, np.float64, 16, emulated(1))
    for a, b in zip(bits, vals, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("where", ["x", "b", "dt"])
def test_a_non_finite_input_starts_a_chunk_as_in_numba(where):
    """An Inf or NaN at token 21 of a 32-token chunk: the outputs of tokens 0..20 stay finite and
    the NaNs fall where the Numba kernel's do."""
    kw = case(np.random.default_rng(5), 50, 2, 2, 8, 16)
    if where == "dt":
        kw["dt"][21, 1] = np.nan
    else:
        kw[where][21, 1, 2] = np.inf
    y, _ = streamed(kw, INF, [0, 50], np.float32, np.float64, 32, emulated(1))
    yn, _ = streamed(kw, INF, [0, 50], np.float32, np.float64, 32)
    assert np.isfinite(y[:21]).all()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(yn))
    fin = np.isfinite(yn)
    np.testing.assert_allclose(y[fin], yn[fin], rtol=1e-4, atol=1e-5)


def test_decays_that_erase_the_state_give_no_nan():
    """Time steps so large that e^{s·A} underflows to 0 (floored): the state is erased, never
    NaN, within the derived tolerance of the reference."""
    kw = case(np.random.default_rng(6), 40, 1, 2, 4, 8)
    kw["dt"][10] = 1e4
    y, s = check(kw, INF, [0, 13, 40], np.float64, np.float64, 16)
    assert np.isfinite(y).all() and np.isfinite(s).all()


def test_little_shared_memory_runs_shorter_chunks():
    """At the 48 KiB a block gets without opting in, 64-token chunks of d_state 128 do not fit
    (95 KiB): the wrapper launches shorter ones, and the results still match."""
    kw = case(np.random.default_rng(8), 90, 1, 1, 4, 128)
    assert sk.ssd_shared_bytes(64, 128, 4) > 48 * 1024
    run = emulated(1, max_shared=48 * 1024)
    y, s = streamed(kw, INF, [0, 90], np.float32, np.float64, 64, run)
    kern = run.launcher._kernels[next(k for k in run.launcher._kernels if k[1] == "ssd_chunks")]
    assert all(la["shared_mem"] <= 48 * 1024 for la in kern.launches)
    ref = tolerances(kw, INF, np.float32, np.float64)
    assert worst(y, ref["y64"]) <= ref["tol"] and worst(s, ref["s64"]) <= ref["tol_s"]


def test_empty_calls_and_where_results_live():
    """T = 0 returns an empty output and leaves the state; NumPy inputs give NumPy results, and
    the given state array is the one updated (in place, as the Numba kernel does)."""
    kw = case(np.random.default_rng(4), 0, 1, 2, 4, 4)
    state = np.full((2, 4, 4), 7.0)
    y = ssd_chunks(kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"], kw["d"], state,
                   launcher=EmuLauncher())  # fmt: skip
    assert isinstance(y, np.ndarray) and y.shape == (0, 2, 4) and (state == 7).all()
    kw = case(np.random.default_rng(4), 12, 1, 2, 4, 4)
    y, s = streamed(kw, INF, [0, 5, 12], np.float64, np.float64, 8, emulated(0))
    assert isinstance(y, np.ndarray)
    ref = tolerances(kw, INF, np.float64, np.float64)  # the second call read the state back
    assert worst(s, ref["s64"]) <= ref["tol_s"] and worst(y, ref["y64"]) <= ref["tol"]


def test_mixed_input_dtypes_and_groups_are_refused_in_one_line():
    kw = case(np.random.default_rng(9), 4, 2, 1, 4, 4)
    state = np.zeros((2, 4, 4))
    args = (kw["x"].astype(np.float32), kw["dt"], kw["a"], kw["b"], kw["c"].astype(np.float32))
    with pytest.raises(TypeError, match="must share one dtype, got x float32, b float64, c"):
        ssd_chunks(*args, kw["d"], state, launcher=EmuLauncher())
    x3 = np.zeros((4, 3, 4), np.float32)
    b2 = np.zeros((4, 2, 4), np.float32)
    with pytest.raises(
        ValueError, match="expected H a multiple of the groups G of B and C, got H=3"
    ):
        ssd_chunks(x3, np.zeros((4, 3)), -np.ones(3), b2, b2, None, np.zeros((3, 4, 4)),
                   launcher=EmuLauncher())  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dtypes", ["f32-state64", "f64-state64"])
def test_mamba2_head_shape(dtypes):
    """Mamba-2 130M's head shape (P = 64: four row tiles; N = 128: 95 KiB of shared memory at
    C = 64 in float32, 190 KiB in float64, both opted into), 2 heads of one group."""
    cdt, sdt = DTYPES[dtypes]
    kw = case(np.random.default_rng(30), 150, 1, 2, 64, 128)
    print(f"seed=30 T=150 H=2 P=64 N=128 C=64 {dtypes}")
    check(kw, INF, [0, 100, 150], cdt, sdt, 64)


BROKEN = {  # name: (text in the kernel's source, its broken replacement)
    "no barrier between the decays and M": (
        "        __syncthreads();\n        // 3. M",
        "        // 3. M",
    ),
    "segment sums one token short": (
        "sm[i * C + j] = REXP((real_t)acc) * (real_t)sst[j];\n                acc += sla[j];",
        "acc += sla[j];\n                sm[i * C + j] = REXP((real_t)acc) * (real_t)sst[j];",
    ),
    "the first token's decay left out of the state": ("exp(la0 + sgs[n - 1])", "exp(sgs[n - 1])"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_kernel_is_caught(name):
    """The check every case above runs passes on the real source and fails on each broken
    variant (a missing barrier by the two orders, wrong math by the reference)."""
    old, new = BROKEN[name]
    assert old in sk.ssd_source("float32", "float32", "float64")

    def mutate(source: str) -> str:
        return source.replace(old, new)

    kw = case(np.random.default_rng(40), 70, 1, 2, 8, 16)
    check(kw, INF, [0, 30, 70], np.float32, np.float64, 16)
    with pytest.raises(AssertionError) as caught:
        check(kw, INF, [0, 30, 70], np.float32, np.float64, 16, mutate=mutate)
    print(f"{name}: {str(caught.value).splitlines()[0]}")
