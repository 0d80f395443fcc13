"""The CuPy backend's algorithm and kernels, run on the CPU.

`scan_causal` is the code `cupy_causal` runs on the GPU, written against an array namespace: here
it runs with `xp=numpy`, once with the kernels as plain array code (`NumpyKernels`) and once with
NumPy emulations of the two CUDA kernels' index arithmetic (`EmulatedKernels`).  Both are compared
with the float64 oracle over random chunk splits.  The CUDA sources are compiled for sm_90 with
NVRTC when its library is installed (no device needed).

The helpers `make_case`, `run_split` and `assert_matches_oracle` are shared with
test_cupy_gpu.py, which runs the same assertions through `cupy_causal` on a device.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.ops.additive import cupy_kernels as ck
from linstream.ops.additive.cupy import EmulatedKernels, NumpyKernels, scan_causal
from linstream.ops.additive.naive import causal_quadratic
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import FeatureMap, get_feature_map


class SignSplit(FeatureMap):
    """Test-only map with F = 2·d_k and no fused kernel: [relu(x), relu(-x)] + 0.1, and a
    query map that differs from the key map."""

    name = "test-sign-split"

    def out_dim(self, d_in: int) -> int:
        return 2 * d_in

    def __call__(self, x: Any, xp: Any = np) -> Any:
        return xp.concatenate([xp.maximum(x, 0), xp.maximum(-x, 0)], axis=-1) + 0.1

    def query(self, x: Any, xp: Any = np) -> Any:
        """Queries rescaled per token (as FAVOR+ may): checks that q goes through `query`."""
        y = self(x, xp=xp)
        return y * (1.0 + xp.abs(x).sum(axis=-1, keepdims=True))


FEATURE_MAPS = {
    "elu+1": get_feature_map("elu+1"),
    "relu": get_feature_map("relu"),
    "identity": get_feature_map("identity"),
    "sign-split": SignSplit(),
}


def bf16_round(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bits as uint16, the float32 they stand for): round-to-nearest-even to bfloat16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = u.astype(np.uint16)
    return bits, (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def make_case(
    seed: int, t: int, h: int, dk: int, dv: int, fmap: str, in_dtype: str
) -> dict[str, Any]:
    """Random q/k/v and a random starting state; `exact` holds the values the oracle sees."""
    rng = np.random.default_rng(seed)
    fm = FEATURE_MAPS[fmap]
    if fmap in ("identity", "relu"):  # keep every denominator well away from zero
        q = rng.uniform(0.1, 1.0, (t, h, dk))
        k = rng.uniform(0.1, 1.0, (t, h, dk))
    else:
        q, k = rng.standard_normal((t, h, dk)), rng.standard_normal((t, h, dk))
    v = rng.standard_normal((t, h, dv))
    f = fm.out_dim(dk)
    n0 = int(rng.integers(0, 50))  # tokens "seen" before: a state from a plausible prefix
    s0 = AttentionState(rng.uniform(-0.5, 0.5, (h, f, dv)) * n0, rng.uniform(0.5, 1.0, (h, f)) * n0)
    arrays: dict[str, Any] = {}
    exact: dict[str, np.ndarray] = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        if in_dtype == "bfloat16":
            bits, val = bf16_round(x)
            arrays[name], exact[name] = bits, val.astype(np.float64)
        else:
            arrays[name] = x.astype(in_dtype)
            exact[name] = arrays[name].astype(np.float64)
    return {"arrays": arrays, "exact": exact, "state": s0, "fm": fm, "rng": rng}


def split_points(rng: np.random.Generator, t: int, n_splits: int) -> list[int]:
    cuts = sorted(set(rng.integers(0, t + 1, n_splits).tolist()))
    return [0, *cuts, t]


def run_split(fn: Any, case: dict[str, Any], bounds: list[int]) -> tuple[np.ndarray, Any]:
    """Run fn(q, k, v, state) -> (out, state) chunk by chunk over `bounds`, carrying the state."""
    a = case["arrays"]
    state = case["state"]
    outs = []
    for s, e in itertools.pairwise(bounds):
        if e == s:
            continue
        out, state = fn(a["q"][s:e], a["k"][s:e], a["v"][s:e], state)
        outs.append(np.asarray(out, dtype=np.float64))
    return np.concatenate(outs, axis=0), state


def assert_matches_oracle(
    case: dict[str, Any], out: np.ndarray, state: Any, *, eps: float, tol: float
) -> None:
    """Per-token relative norm error of out, and the carried state, against the float64 oracle."""
    ex = case["exact"]
    ref, ref_state = causal_quadratic(
        ex["q"], ex["k"], ex["v"], case["state"], feature_map=case["fm"], eps=eps
    )
    assert out.shape == ref.shape
    err = np.linalg.norm(out - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-2)
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= tol, f"per-token error {err.max():.3g} > {tol} at (t, h) = {worst}"
    assert state.S.dtype == case["state"].S.dtype
    s_scale = max(1.0, float(np.abs(ref_state.S).max()))
    z_scale = max(1.0, float(np.abs(ref_state.z).max()))
    np.testing.assert_allclose(np.asarray(state.S), ref_state.S, rtol=0, atol=tol * s_scale)
    np.testing.assert_allclose(np.asarray(state.z), ref_state.z, rtol=0, atol=tol * z_scale)


TOL = {"float32": 2e-5, "bfloat16": 2e-5, "float64": 1e-10}


def _xp_fn(kernels: Any, fm: FeatureMap, in_dtype: str, c: int, eps: float) -> Any:
    cdt = np.float64 if in_dtype == "float64" else np.float32

    def fn(q: Any, k: Any, v: Any, state: AttentionState) -> Any:
        kinds = (in_dtype, in_dtype, in_dtype)
        return scan_causal(
            q,
            k,
            v,
            state,
            feature_map=fm,
            eps=eps,
            chunk_size=c,
            dtype=cdt,
            xp=np,
            kernels=kernels,
            kinds=kinds,
        )

    return fn


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
    fn = _xp_fn(NumpyKernels(np), case["fm"], in_dtype, c, 1e-6)
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
    out, state = run_split(_xp_fn(NumpyKernels(np), case["fm"], "float32", 16, 1e-6), case, [0, 40])
    assert state.S.dtype == np.float32 and state.z.dtype == np.float32
    for n, x in case["arrays"].items():
        np.testing.assert_array_equal(x, before[n])
    np.testing.assert_array_equal(s32.S, s_before.S)
    assert_matches_oracle(case, out, state, eps=1e-6, tol=5e-5)


def test_worked_example_through_the_scan():
    keys = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])[:, None, :]
    values = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])[:, None, :]
    for kernels in (NumpyKernels(np), EmulatedKernels(np)):
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


# ---- the CUDA kernels' indexing, emulated -------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(1, 70),
    h=st.integers(1, 2),
    dk=st.sampled_from([2, 5]),
    dv=st.sampled_from([1, 3, 16]),  # 16 with c = 16 or 32: the register-tiled kernel
    c=st.sampled_from([1, 4, 16, 32]),
    n_splits=st.integers(0, 3),
    fmap=st.sampled_from(sorted(FEATURE_MAPS)),
    in_dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
)
def test_emulated_kernels_match_oracle_for_random_splits(
    seed, t, h, dk, dv, c, n_splits, fmap, in_dtype
):
    case = make_case(seed, t, h, dk, dv, fmap, in_dtype)
    bounds = split_points(case["rng"], t, n_splits)
    fn = _xp_fn(EmulatedKernels(np), case["fm"], in_dtype, c, 1e-6)
    out, state = run_split(fn, case, bounds)
    assert_matches_oracle(case, out, state, eps=1e-6, tol=TOL[in_dtype])


@pytest.mark.parametrize("fmap", sorted(ck.FUSED_MAPS))
@pytest.mark.parametrize("in_dtype", ["float32", "float64", "bfloat16"])
def test_emulated_prep_equals_array_prep(fmap, in_dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((13, 3, 5))
    raw = bf16_round(x)[0] if in_dtype == "bfloat16" else x.astype(in_dtype)
    fm = get_feature_map(fmap)
    for role in ("q", "k", "v"):
        ones_col = role == "v"
        got = ck.emulate_prep(  # V (ones_col) is never feature-mapped
            raw,
            fmap="identity" if ones_col else fmap,
            in_dtype=in_dtype,
            real_dtype="float32",
            tp=16,
            ones_col=ones_col,
        )
        want = NumpyKernels(np).prep(raw, in_dtype, fm, np.float32, 16, role)
        assert got.shape == want.shape == (3, 16, 5 + ones_col)
        np.testing.assert_array_equal(got, want)
        assert not got[:, 13:].any(), "padding rows must be zero, even where φ(0) != 0"


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
    got = ck.emulate_intra(a, vx, inter, t_len=t, eps=1e-6)
    want = NumpyKernels(np).intra(a, vx, inter, 1e-6, t)
    assert got.shape == want.shape == (t, h, dv)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("real", ["float32", "float64"])
def test_emulated_scan_equals_array_scan(real):
    rng = np.random.default_rng(8)
    ds = rng.standard_normal((3, 9, 4, 6)).astype(real)
    s0 = rng.standard_normal((3, 4, 6))
    pre, fin = ck.emulate_scan(ds, s0, real)
    want_pre, want_fin = NumpyKernels(np).scan(ds, s0, np.dtype(real))
    assert pre.dtype == np.dtype(real) and fin.dtype == np.float64
    np.testing.assert_array_equal(pre, want_pre)
    np.testing.assert_allclose(fin, want_fin, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(fin, s0 + ds.astype(np.float64).sum(axis=1), rtol=1e-13)


def test_bf16_bits_widen_exactly():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    bits, val = bf16_round(x)
    np.testing.assert_array_equal(x.astype(ml_dtypes.bfloat16).view(np.uint16), bits)
    np.testing.assert_array_equal(ck._bf16_bits_to_f32(bits), val)


# ---- the CUDA sources -------------------------------------------------------------------------


def test_sources_define_the_macros_the_emulations_use():
    for src, macros in (
        (ck.prep_source("elu+1", "float32", "float32"), ck.PREP_MACROS),
        (ck.intra_source(64, 64, "float32"), ck.INTRA_MACROS),
        (ck.intra_source(7, 5, "float32"), ck.INTRA_MACROS),
        (ck.scan_source("float32"), ck.SCAN_MACROS),
    ):
        for name, (args, body) in macros.items():
            assert f"#define {name}({', '.join(args)}) {body}" in src


def _nvrtc() -> Any:
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as ex:  # library absent: this check needs nvidia-cuda-nvrtc-cu12
        pytest.skip(f"NVRTC is not loadable here ({type(ex).__name__}: {ex})")
    return nvrtc


def _compile(nvrtc: Any, src: str, name: str) -> str:
    prog = nvrtc.createProgram(src, f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=sm_90", "--ptxas-options=-v"])
    except Exception as ex:
        raise AssertionError(f"{name} failed to compile:\n{nvrtc.getProgramLog(prog)}") from ex
    return str(nvrtc.getProgramLog(prog))


def test_cuda_sources_compile_for_sm90():
    nvrtc = _nvrtc()
    preps = [(fmap, "float32", "float32") for fmap in ck.FUSED_MAPS]
    preps += [("elu+1", "bfloat16", "float32"), ("elu+1", "float64", "float64")]
    for fmap, in_dtype, real in preps:
        _compile(nvrtc, ck.prep_source(fmap, in_dtype, real), f"prep-{fmap}-{in_dtype}-{real}")
    for real in ("float32", "float64"):
        _compile(nvrtc, ck.scan_source(real), f"scan-{real}")
    intras = [(1, 1), (16, 5), (16, 16), (64, 64), (128, 128)]
    for c, dv, real in [(c, dv, "float32") for c, dv in intras] + [(64, 64, "float64")]:
        log = _compile(nvrtc, ck.intra_source(c, dv, real), f"intra-{c}-{dv}-{real}")
        if real == "float32":
            assert "0 bytes spill stores" in log, log


# ---- cupy_causal's own code (inputs, dtypes, where results live), NumPy standing in for CuPy --


@pytest.fixture
def numpy_as_cupy(monkeypatch):
    """cupy_causal with NumPy in place of the cupy module and the emulated kernels."""
    import types

    from linstream.ops.additive import cupy as cupy_backend

    shim = types.ModuleType("numpy_as_cupy")
    shim.__getattr__ = lambda name: getattr(np, name)
    shim.asnumpy = np.asarray
    monkeypatch.setattr(cupy_backend, "xp_cupy", lambda: shim)
    monkeypatch.setattr(cupy_backend, "_cupy_kernels", lambda: EmulatedKernels(np))
    return cupy_backend.cupy_causal


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
