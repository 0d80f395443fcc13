"""The DPLR kernel's CUDA source (ops/dplr/cupy_kernels.py, RWKV-7's time mix) run on the CPU by
the emulator (tests/helpers/cuda_emu.py: the source compiled as C++, every block and thread of the
launch run, shared memory poisoned, arrays guarded), through the wrapper a device runs
(ops/dplr/cupy.py).

Each case runs in forward and in reverse thread and block order: the two must give the same bits
(an order-dependent result is a race) and stay within the derived tolerance of the float64
token-by-token reference (tests/helpers/dplr_cases.py), over random splits into calls and random
chunk lengths (Hypothesis draws a seed; seed, shapes and splits are printed); the Numba kernel,
within the same tolerance of the same reference, is then within twice it of the CUDA kernel.
Then what a device run must also keep: bfloat16 inputs give exactly the float32 results of their
values; decays too strong for one chunk's product end the chunk, erasing decays give no NaN and a
non-finite value starts a chunk, as in the Numba kernel; a device with little shared memory runs
shorter chunks; results live where the caller put them.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.bf16 import bf16_round
from helpers.cuda_emu import EmuLauncher, compiler_missing
from helpers.dplr_cases import DTYPES, inputs, run, tolerance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.cuda import Bfloat16Bits
from linstream.ops.dplr import cupy_kernels as dk_
from linstream.ops.dplr.cupy import dplr_chunks
from linstream.ops.dplr.naive import dplr_recurrent

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))


def emulated(schedule: int, **kw):
    """dplr_chunks on an emulator launcher (the kernel argument of `run`)."""
    lau = EmuLauncher(schedule, **kw)

    def kernel(*args, **kwargs):
        return dplr_chunks(*args, **kwargs, launcher=lau)

    kernel.launcher = lau  # type: ignore[attr-defined]
    return kernel


def check(x, s0, bounds, c, cdt, sdt, **launcher_kw):
    """Forward and reverse order give the same bits, within the derived tolerance of the
    reference; the Numba kernel within twice it.  Returns the forward run and the reference."""
    runs = [run(x, s0, bounds, c, cdt, sdt, emulated(s, **launcher_kw)) for s in (0, 1)]
    for got, again in zip(runs[0], runs[1], strict=True):
        assert np.array_equal(got, again, equal_nan=True), "forward and reverse differ (a race)"
    out, s = runs[0]
    ref, s_ref = dplr_recurrent(*x, state=s0)
    tol = tolerance(x, ref, s_ref, x[0].shape[0], c, cdt, sdt)
    err = max(float(np.max(np.abs(out - ref))), float(np.max(np.abs(s - s_ref))))
    print(f"|Δ| {err:.3g}, tolerance {tol:.3g}")
    assert err <= tol
    out_n, s_n = run(x, s0, bounds, c, cdt, sdt)
    assert float(np.max(np.abs(out - out_n))) <= 2 * tol
    assert float(np.max(np.abs(s - s_n))) <= 2 * tol
    return (out, s), (ref, s_ref)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("form", ["rwkv", "general"])
@pytest.mark.parametrize("dtypes", list(DTYPES))
def test_random_splits_match_the_reference_and_numba(dtypes, form, seed):
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(seed)
    t, h = int(rng.integers(1, 100)), int(rng.integers(1, 3))
    dk, dv = int(rng.choice([1, 5, 16])), int(rng.choice([1, 5, 20]))  # 20: two value tiles
    c = int(rng.choice([1, 3, 16, 32]))
    bounds = sorted({0, t, *rng.integers(0, t + 1, size=int(rng.integers(0, 4))).tolist()})
    print(f"seed={seed} {dtypes} {form} T={t} H={h} dk={dk} dv={dv} C={c} bounds={bounds}")
    x = tuple(np.asarray(y, cdt).astype(np.float64) for y in inputs(rng, t, h, dk, dv, form))
    s0 = np.asarray(rng.standard_normal((h, dk, dv)), sdt)
    check(x, s0, bounds, c, cdt, sdt)


def test_bfloat16_inputs_give_the_float32_results_of_their_values():
    """bfloat16 widens exactly, then the same float32 math: the same bits as float32 inputs."""
    rng = np.random.default_rng(21)
    x = tuple(bf16_round(y)[1].astype(np.float64) for y in inputs(rng, 50, 2, 8, 20))
    s0 = rng.standard_normal((2, 8, 20))
    bits = run(x, s0, [0, 20, 50], 16, np.float32, np.float64, emulated(1),
               convert=lambda y: Bfloat16Bits(bf16_round(y)[0]))  # fmt: skip
    vals = run(x, s0, [0, 20, 50], 16, np.float32, np.float64, emulated(1))
    for got, want in zip(bits, vals, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtypes", ["f32-state64", "f64-state64"])
def test_decays_too_strong_for_one_chunk_product_are_cut(dtypes):
    """log w = −5 at every token but one slow dimension: the split product of a 32-token chunk
    would overflow; the kernel ends its chunks before −SPAN, as the Numba kernel does."""
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(11)
    x = list(inputs(rng, 70, 1, 8, 4))
    x[5] = np.full((70, 1, 8), -5.0)
    x[5][:, :, 0] = -0.01
    x = tuple(np.asarray(y, cdt).astype(np.float64) for y in x)
    (out, _), _ = check(x, np.zeros((1, 8, 4)), [0, 70], 32, cdt, sdt)
    assert np.isfinite(out).all()


def test_erasing_decays_and_non_finite_values():
    """Decays of −inf and −finfo.max erase the state there, as in the reference; an Inf in v
    reaches the outputs from its own token on, never an earlier token's (non-finite where
    Numba's are: at its own token ±inf here, NaN there, where BLAS adds the masked 0·inf)."""
    rng = np.random.default_rng(12)
    x = [np.asarray(y, np.float32).astype(np.float64) for y in inputs(rng, 40, 2, 6, 5)]
    x[5][[9, 13], 0, :] = [[-np.inf], [-np.finfo(np.float32).max]]
    (out, s), _ = check(tuple(x), np.zeros((2, 6, 5)), [0, 40], 32, np.float32, np.float64)
    assert np.isfinite(out).all() and np.isfinite(s).all()
    x[2][20, 1, 0] = np.inf
    got, _ = run(x, np.zeros((2, 6, 5)), [0, 40], 32, np.float32, np.float64, emulated(1))
    want, _ = run(x, np.zeros((2, 6, 5)), [0, 40], 32, np.float32, np.float64)
    assert np.isfinite(got[:20]).all()
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))


def test_little_shared_memory_runs_shorter_chunks():
    """At the 48 KiB a block gets without opting in, 64-token chunks of d_k = 64 (172 KiB) do
    not fit: the wrapper launches shorter ones, and the results still match."""
    rng = np.random.default_rng(8)
    x = tuple(np.asarray(y, np.float32).astype(np.float64) for y in inputs(rng, 40, 1, 64, 3))
    assert dk_.dplr_shared_bytes(64, 64, 4) > 48 * 1024
    kern = emulated(1, max_shared=48 * 1024)
    out, s = run(x, np.zeros((1, 64, 3)), [0, 40], 64, np.float32, np.float64, kern)
    (launched,) = kern.launcher._kernels.values()
    assert all(la["shared_mem"] <= 48 * 1024 for la in launched.launches)
    ref, s_ref = dplr_recurrent(*x)
    tol = tolerance(x, ref, s_ref, 40, 64, np.float32, np.float64)
    assert float(np.max(np.abs(out - ref))) <= tol and float(np.max(np.abs(s - s_ref))) <= tol


def test_empty_calls_strided_inputs_and_where_results_live():
    """T = 0 returns an empty output and leaves the state; [T, H, D] views with any strides (a
    model's projections, reshaped) give the bits of contiguous copies; NumPy inputs give NumPy
    results, and the given state array is the one updated (in place, as the Numba kernel)."""
    s = np.full((2, 4, 3), 7.0)
    e = np.zeros((0, 2, 4), np.float32)
    out = dplr_chunks(e, e, np.zeros((0, 2, 3), np.float32), e, e, e, s, launcher=EmuLauncher())
    assert isinstance(out, np.ndarray) and out.shape == (0, 2, 3) and (s == 7).all()
    rng = np.random.default_rng(5)
    wide = rng.standard_normal((30, 2, 6 * 4)).astype(np.float32)
    x = [wide[:, :, i * 4 : (i + 1) * 4] for i in range(6)]
    x[5] = -np.abs(x[5]) * 0.3
    s1, s2 = np.zeros((2, 4, 4)), np.zeros((2, 4, 4))
    o1 = dplr_chunks(*x, s1, chunk_size=8, launcher=EmuLauncher())
    o2 = dplr_chunks(*(np.ascontiguousarray(y) for y in x), s2, chunk_size=8,
                     launcher=EmuLauncher())  # fmt: skip
    assert isinstance(o1, np.ndarray)
    assert np.array_equal(o1, o2) and np.array_equal(s1, s2) and np.abs(s1).max() > 0


def test_mixed_input_dtypes_are_refused_in_one_line():
    z = np.zeros((3, 1, 2), np.float32)
    with pytest.raises(TypeError, match="must share one dtype, got q float32, k float64, v"):
        dplr_chunks(z, z.astype(np.float64), z, z, z, z, np.zeros((1, 2, 2)),
                    launcher=EmuLauncher())  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dtypes", ["f32-state64", "f64-state64"])
def test_rwkv7_head_shape(dtypes):
    """RWKV-7's head shape (d_k = d_v = 64: four value tiles) at chunks of 64 (172 KiB of shared
    memory in float32, opted into; float64 runs shorter chunks on the 227 KiB of an H200)."""
    cdt, sdt = DTYPES[dtypes]
    rng = np.random.default_rng(31)
    print(f"seed=31 T=150 H=2 dk=dv=64 C=64 {dtypes}")
    x = tuple(np.asarray(y, cdt).astype(np.float64) for y in inputs(rng, 150, 2, 64, 64))
    check(x, np.asarray(rng.standard_normal((2, 64, 64)), sdt), [0, 90, 150], 64, cdt, sdt)


BROKEN = {  # name: (text in the kernel's source, its broken replacement)
    "no barrier between R and U": (
        "            su[i * TILE + r] = acc + st;\n        }\n        __syncthreads();",
        "            su[i * TILE + r] = acc + st;\n        }\n",
    ),
    "forward substitution skips the chunk's first token": (
        "for (int j = 0; j < i; ++j) acc += sab",
        "for (int j = 1; j < i; ++j) acc += sab",
    ),
    "the first token's decay left out of the state": (
        "exp(sgf[p] + sg[(n - 1) * DK + p])",
        "exp(sg[(n - 1) * DK + p])",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_kernel_is_caught(name):
    """The check every case above runs passes on the real source and fails on each broken
    variant (a missing barrier by the two orders, wrong math by the reference)."""
    old, new = BROKEN[name]
    assert old in dk_.dplr_source("float32", "float32", "float64")

    def mutate(source: str) -> str:
        return source.replace(old, new)

    rng = np.random.default_rng(40)
    x = tuple(np.asarray(y, np.float32).astype(np.float64) for y in inputs(rng, 70, 2, 8, 20))
    s0 = rng.standard_normal((2, 8, 20))
    check(x, s0, [0, 30, 70], 16, np.float32, np.float64)
    with pytest.raises(AssertionError) as caught:
        check(x, s0, [0, 30, 70], 16, np.float32, np.float64, mutate=mutate)
    print(f"{name}: {str(caught.value).splitlines()[0]}")
