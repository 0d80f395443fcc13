"""The CUDA emulator (tests/helpers/cuda_emu.py) catches what it claims to: the tests of the
tests that run the kernels' source on the CPU.

1. Its launch checks, each on a small kernel written to break one rule: a barrier in divergent
   code, threads at different barriers, a write past the launch's shared memory or outside an
   array, arguments of the wrong type, dtype, layout or overlap, shared memory above 48 KiB
   without opting in, a block larger than `__launch_bounds__`, and a missing barrier, which
   forward and reverse thread orders expose.
2. Deliberately broken variants of the real kernels (a missing barrier, an off-by-one in a loop
   or chunk bound, a cross-block race, a shared-memory size too small): the same check the
   kernel tests run passes on the real source and fails on each variant.  `-s` prints what
   caught each one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import numpy as np
import pytest
from helpers import additive_cases as cases
from helpers.cuda_emu import EmuError, EmuLauncher, compiler_missing
from helpers.rule_kernels import check_emulated, make_case
from linstream.ops.additive.cupy import CupyKernels

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))

# ---- 1. launch checks ---------------------------------------------------------------------

SMALL = """
extern "C" __global__ void __launch_bounds__(128)
small(const float* __restrict__ x, float* __restrict__ y, const long long n, const int mode) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* s = reinterpret_cast<float*>(smem_raw);
    const int t = threadIdx.x;
    if (mode == 1 && t >= 64) return;           // leaves before the barrier the others reach
    if (mode == 2 && t == 0) __syncthreads();   // thread 0 at another barrier than the rest
    s[t] = x[t];
    if (mode == 3) s[blockDim.x] = 1.0f;        // one float past the shared memory given
    if (mode == 4 && t == 0) y[n] = 1.0f;       // one past the end of y
    if (mode != 5) __syncthreads();             // mode 5: the barrier is missing
    y[t] = s[(t + 1) % blockDim.x];
}
"""


def _small(mode: int, *, schedule: int = 0, n: int = 128, **kw) -> np.ndarray:
    lau = EmuLauncher(schedule=schedule)
    kern = lau.kernel(SMALL, "small")
    x = np.arange(n, dtype=np.float32)
    y = lau.xp.empty(n, dtype=np.float32)
    args = kw.pop("args", (x, y, np.int64(n), np.int32(mode)))
    kern((1,), kw.pop("block", (n,)), args, shared_mem=kw.pop("shared_mem", 4 * n))
    return y


def test_a_correct_small_kernel_runs_in_every_order():
    for schedule in (0, 1, 2, 3):
        np.testing.assert_array_equal(_small(0, schedule=schedule), np.roll(np.arange(128), -1))


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (1, r"__syncthreads\(\) at line \d+ reached by 64 threads while 64 had exited"),
        (2, r"threads wait at different __syncthreads\(\)"),
        (3, r"wrote shared memory at byte 512, past the launch's shared_mem of 512 bytes"),
        (4, r"argument 1: the kernel wrote outside the array"),
    ],
    ids=["divergent-barrier", "different-barriers", "shared-overflow", "global-overflow"],
)
def test_undefined_behaviour_fails_the_launch(mode, said):
    with pytest.raises(EmuError, match=said):
        _small(mode)


def test_a_missing_barrier_shows_in_one_of_the_two_orders():
    """Thread t reads what thread t+1 wrote: run forward, t+1 has not written yet (the poison,
    NaN); run backward, it has.  So the orders disagree, and the forward run is wrong."""
    forward, reverse = _small(5, schedule=0), _small(5, schedule=1)
    assert np.isnan(forward[:-1]).all()
    np.testing.assert_array_equal(reverse[:-1], np.arange(1, 128))


def test_arguments_are_checked_against_the_kernel_signature():
    x = np.zeros(128, np.float32)
    y = np.zeros(128, np.float32)
    cases: list[tuple[tuple, str]] = [
        ((x, y, 128, np.int32(0)), "argument 2: expected a NumPy int64 scalar, got int"),
        ((x, y, np.int32(128), np.int32(0)), "argument 2: expected a NumPy int64 scalar"),
        ((x.astype(np.float64), y, np.int64(128), np.int32(0)), "a float64 array for a float32"),
        ((np.zeros((128, 2), np.float32)[:, 0], y, np.int64(128), np.int32(0)), "non-contiguous"),
        ((x, x, np.int64(128), np.int32(0)), "arguments 0 and 1 overlap in memory and the kernel"),
        ((x, y, np.int64(128)), r"3 arguments for parameters \['\*f', '\*fw', 'q', 'i'\]"),
    ]
    for args, said in cases:
        with pytest.raises(EmuError, match=said):
            _small(0, args=args)


def test_launch_limits_of_a_device():
    with pytest.raises(EmuError, match=r"exceeds the kernel's __launch_bounds__\(128\)"):
        _small(0, n=256)
    with pytest.raises(EmuError, match="> 48 KiB needs max_dynamic_shared_size_bytes"):
        _small(0, shared_mem=64 * 1024)


# ---- 2. broken variants of the real kernels -------------------------------------------------


def _replace(old: str, new: str, source: str) -> str:
    """source with `old` replaced by `new`; ValueError unless `old` occurs exactly once (so a
    variant can never silently be the unbroken kernel)."""
    if source.count(old) != 1:
        msg = f"the variant's pattern occurs {source.count(old)} times, expected once: {old!r}"
        raise ValueError(msg)
    return source.replace(old, new)


def variant(old: str, new: str) -> Callable[[str], str]:
    return functools.partial(_replace, old, new)


# rule, what is broken, the source change
BROKEN_RULE_KERNELS = {
    "decay: no barrier between A and its readers": (
        "gated",
        variant("            sa[i * C + j] = a;\n        }\n        __syncthreads();",
                "            sa[i * C + j] = a;\n        }\n"),
    ),
    "decay: z read from the state, which tile 0 overwrites (a race between blocks)": (
        "gated",
        variant("sz[p] = z0[h * F + p];", "sz[p] = sh[(long long)p * W + DV];"),
    ),
    "decay: a chunk one token longer than its tiles": (
        "gated",
        variant("lah, c0, min(c0 + C, T)", "lah, c0, min(c0 + C + 1, T)"),
    ),
    "decay: the chunk's last gate sum off by one": (
        "gated",
        variant("const double gn = sg[n - 1];", "const double gn = sg[n > 1 ? n - 2 : 0];"),
    ),
    "vector: no barrier between the in-place scaling of q, k and its readers": (
        "vector",
        variant("sg[e]));\n        }\n        __syncthreads();", "sg[e]));\n        }\n"),
    ),
    "vector: the in-chunk sum stops before the diagonal": (
        "vector",
        variant("for (int j = 0; j <= i; ++j) intra += sa[i * C + j] * sv[j * TILE + jj];",
                "for (int j = 0; j < i; ++j) intra += sa[i * C + j] * sv[j * TILE + jj];"),
    ),
    "delta: forward substitution starts one column late": (
        "gated_delta",
        variant("for (int j = r; j < i; ++j) x -=", "for (int j = r + 1; j < i; ++j) x -="),
    ),
    "delta: no barrier between T and U = T R": (
        "gated_delta",
        variant("sv[m * TILE + jj] = sb[m] * sv[m * TILE + jj] - sebg[m] * ks;\n        }\n"
                "        __syncthreads();",
                "sv[m * TILE + jj] = sb[m] * sv[m * TILE + jj] - sebg[m] * ks;\n        }\n"),
    ),
}  # fmt: skip


def _rule_case(rule: str):
    """Two value tiles (d_v = 20), three calls, 16-token chunks, float64 math (tolerance ~1e-13)."""
    return make_case(rule, 4, 100, 2, 8, 20)


@pytest.mark.parametrize("name", list(BROKEN_RULE_KERNELS))
def test_a_broken_rule_kernel_is_caught(name):
    rule, mutate = BROKEN_RULE_KERNELS[name]
    case = _rule_case(rule)
    kw = {"c": 16, "cdt": np.float64, "sdt": np.float64}
    check_emulated(case, [0, 37, 100], **kw)  # the real kernel passes this very check
    with pytest.raises((AssertionError, EmuError)) as caught:
        check_emulated(case, [0, 37, 100], mutate=mutate, **kw)
    print(f"{name}: caught by {type(caught.value).__name__}: {str(caught.value)[:160]}")


def test_a_shared_memory_size_too_small_is_caught(monkeypatch):
    """The wrapper's size of the delta kernel's shared memory without one of its C x C arrays."""
    from linstream.ops.delta import cupy_kernels as dk

    case = _rule_case("delta")
    true_size = dk.delta_shared_bytes
    monkeypatch.setattr(dk, "delta_shared_bytes", lambda c, f, r: true_size(c, f, r) - c * c * r)
    with pytest.raises(EmuError, match="past the launch's shared_mem"):
        check_emulated(case, [0, 100], c=16, cdt=np.float64, sdt=np.float64)


BROKEN_ADDITIVE = {
    "intra_norm: no barrier after the tile loads": ("intra_norm", "    __syncthreads();\n", ""),
    "prep: padding rows read as tokens": ("prep", "if (t < T) {", "if (t <= T) {"),
    "state_scan: the state before chunk n includes chunk n": (
        "state_scan",
        "pre[idx] = (real_t)acc;\n        acc += d;",
        "acc += d;\n        pre[idx] = (real_t)acc;",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN_ADDITIVE))
def test_a_broken_additive_kernel_is_caught(name):
    kernel, old, new = BROKEN_ADDITIVE[name]

    def mutate(source: str) -> str:
        return _replace(old, new, source) if re.search(rf"\b{kernel}\(", source) else source

    case = cases.make_case(3, 45, 2, 4, 16, "elu+1", "float32")
    bounds = [0, 20, 45]

    def run(**kw) -> None:
        fn = cases.scan_fn(CupyKernels(EmuLauncher(**kw)), case["fm"], "float32", 16, 1e-6)
        out, state = cases.run_split(fn, case, bounds)
        cases.assert_matches_oracle(case, out, state, eps=1e-6, tol=cases.TOL["float32"])

    run(schedule=1)  # the real kernels pass
    with pytest.raises((AssertionError, EmuError)) as caught:
        run(schedule=1, mutate=mutate)
    print(f"{name}: caught by {type(caught.value).__name__}: {str(caught.value)[:160]}")
