"""FAVOR+ equals the textbook formula y = φ(q)ᵀS / (φ(q)ᵀz + eps) for every eps, and float32
stays finite when key exponents pass float32's exp range.

The textbook reference here is written from the formula alone, in float64, O(T²):
φ(x) = exp(Wx' - |x'|²/2)/sqrt(m), x' = x/d^(1/4), W = the map's matrix.

Tolerances (derived): every output is a ratio of sums of at most n = F·(T + 1) positive feature
products times values, so |Δy| ≤ 2·n·u·max|v| for unit roundoff u of the compute dtype; float32
adds the exponent's own rounding, δ = 2·d·u·max(|x'|² + |x'|·|w|), a relative error of the
features (exp(u ± δ)), contributing 4·δ·max|v|.
"""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops import backend as backend_mod
from linstream.ops import causal_linear_attention, linear_attention
from linstream.ops.additive.naive import causal_recurrent
from linstream.ops.backend import cupy_available
from linstream.ops.feature_maps import KEY_EXP_MAX, FavorPlus

SIGMAS = [2.0, 4.0, 8.0]
BACKENDS = [
    "numpy",
    "numba",
    "cupy-emulated",
    pytest.param("cupy", marks=pytest.mark.skipif(not cupy_available(), reason="no CUDA device")),
]


def textbook_phi(fm: FavorPlus, x: np.ndarray) -> np.ndarray:
    d = x.shape[-1]
    w = fm.matrix(d).astype(np.float64)
    xs = np.asarray(x, np.float64) / d**0.25
    return np.exp(xs @ w.T - 0.5 * np.sum(xs * xs, axis=-1, keepdims=True)) / np.sqrt(w.shape[0])


def textbook_causal(fm, q, k, v, eps):
    qf, kf = textbook_phi(fm, q), textbook_phi(fm, k)
    v = np.asarray(v, np.float64)
    t = q.shape[0]
    scores = np.einsum("thf,shf->hts", qf, kf) * np.tril(np.ones((t, t)))
    num = np.einsum("hts,shd->thd", scores, v)
    den = scores.sum(axis=2).T
    return num / (den[..., None] + eps)


def tolerance(fm, x_all, v, dtype) -> float:
    t, _, d = x_all.shape[0] // 2, None, x_all.shape[-1]
    f = fm.out_dim(d)
    u = float(np.finfo(dtype).eps) / 2
    bound = 2 * f * (t + 1) * u
    if dtype == np.float32:
        xs = np.linalg.norm(np.asarray(x_all, np.float64), axis=-1) / d**0.25
        wmax = float(np.max(np.linalg.norm(fm.matrix(d).astype(np.float64), axis=1)))
        delta = 2 * d * u * float(np.max(xs * xs + xs * wmax))
        bound += 4 * delta
    return bound * float(np.max(np.abs(v)))


@pytest.fixture
def cupy_emulated(monkeypatch):
    """backend="cupy" with the CUDA kernels run on the CPU emulator (tests/helpers/cuda_emu.py)."""
    from helpers.cuda_emu import EmuLauncher, compiler_missing
    from linstream.ops.additive import cupy as cupy_backend

    if compiler_missing() is not None:
        pytest.skip(str(compiler_missing()))
    launcher = EmuLauncher(schedule=1)
    monkeypatch.setattr(backend_mod, "cupy_unavailable_reason", lambda: None)
    monkeypatch.setattr(cupy_backend, "cupy_launcher", lambda: launcher)
    monkeypatch.setattr(cupy_backend, "_cupy_kernels", lambda: cupy_backend.CupyKernels(launcher))


def _case(sigma, dtype, seed, t=48, h=2, d=16, dv=5):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((t, h, d)) * sigma
    k = rng.standard_normal((t, h, d)) * sigma
    v = rng.standard_normal((t, h, dv))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _eps_choices(fm, q, k):
    """0, the default, and an eps equal to the median textbook denominator (where both matter)."""
    qf, kf = textbook_phi(fm, q), textbook_phi(fm, k)
    den = np.einsum("thf,thf->th", qf, np.cumsum(kf, axis=0))
    return [0.0, 1e-6, float(np.median(den))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("sigma", SIGMAS, ids=[f"sigma{s:g}" for s in SIGMAS])
@pytest.mark.parametrize("backend", BACKENDS)
def test_equals_textbook_formula_for_every_eps(backend, sigma, dtype, request):
    if backend == "cupy-emulated":
        request.getfixturevalue("cupy_emulated")
        backend = "cupy"
    seed = int(sigma * 10)
    print(f"seed={seed}")
    fm = FavorPlus(num_features=64, seed=1)
    q, k, v = _case(sigma, dtype, seed)
    tol = tolerance(fm, np.concatenate([q, k]), v, dtype)
    for eps in _eps_choices(fm, q, k):
        ref = textbook_causal(fm, q, k, v, eps)
        if eps == 0.0 and not np.all(np.isfinite(ref)):
            continue  # 0/0 in float64 too: nothing to compare
        out, _ = causal_linear_attention(q, k, v, feature_map=fm, eps=eps, backend=backend)
        err = float(np.max(np.abs(out.astype(np.float64) - ref)))
        assert err <= tol, (backend, sigma, eps, err, tol)
        # split in two calls: the carried state keeps the same answer
        a, st = causal_linear_attention(q[:17], k[:17], v[:17], feature_map=fm, eps=eps,
                                        backend=backend)  # fmt: skip
        b, _ = causal_linear_attention(q[17:], k[17:], v[17:], st, feature_map=fm, eps=eps,
                                       backend=backend)  # fmt: skip
        err2 = float(np.max(np.abs(np.concatenate([a, b]).astype(np.float64) - ref)))
        assert err2 <= tol, (backend, sigma, eps, err2, tol)


def test_the_old_scalar_eps_would_fail_this_check():
    """The per-token query factor with a plain eps moves the outputs far past the tolerance."""
    fm = FavorPlus(num_features=64, seed=1)
    q, k, v = _case(2.0, np.float64, 20)
    eps = _eps_choices(fm, q, k)[2]
    qh, kf = fm.query(q), fm(k)
    scores = np.einsum("thf,shf->hts", qh, kf) * np.tril(np.ones((len(q), len(q))))
    old = np.einsum("hts,shd->thd", scores, v) / (scores.sum(axis=2).T[..., None] + eps)
    ref = textbook_causal(fm, q, k, v, eps)
    assert np.max(np.abs(old - ref)) > 1e4 * tolerance(fm, np.concatenate([q, k]), v, np.float64)


@pytest.mark.parametrize("sigma", SIGMAS, ids=[f"sigma{s:g}" for s in SIGMAS])
def test_reference_and_noncausal_form_follow_the_textbook(sigma):
    fm = FavorPlus(num_features=64, seed=1)
    q, k, v = _case(sigma, np.float64, 7)
    tol = tolerance(fm, np.concatenate([q, k]), v, np.float64)
    for eps in _eps_choices(fm, q, k)[1:]:
        out, _ = causal_recurrent(q, k, v, feature_map=fm, eps=eps)
        assert np.max(np.abs(out - textbook_causal(fm, q, k, v, eps))) <= tol
        qf, kf = textbook_phi(fm, q), textbook_phi(fm, k)
        num = np.einsum("thf,hfd->thd", qf, np.einsum("thf,thd->hfd", kf, v))
        ref = num / (np.einsum("thf,hf->th", qf, kf.sum(0))[..., None] + eps)
        got = linear_attention(q, k, v, feature_map=fm, eps=eps, backend="numpy")
        assert np.max(np.abs(got - ref)) <= tol


@pytest.fixture(scope="module")
def wide_map():
    """d=128, m=4096: the largest |w|²/2 passes float32's exp limit (~88.7)."""
    fm = FavorPlus(num_features=4096, seed=0)
    assert fm.exponent_bound(128) > 88.8
    return fm


def _aligned_keys(fm, t, h, d, rng):
    """Keys at x' = w_i for the rows of largest norm: the exponent reaches its bound B."""
    w = fm.matrix(d).astype(np.float64)
    top = np.argsort(-np.sum(w * w, axis=1))[:8]
    rows = w[top[rng.integers(0, len(top), size=(t, h))]]
    return rows * d**0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_stays_finite_where_key_exponents_pass_exp_range(wide_map, backend, request):
    if backend == "cupy-emulated":
        request.getfixturevalue("cupy_emulated")
        backend = "cupy"
    fm, d, t, h = wide_map, 128, 24, 1
    rng = np.random.default_rng(11)
    print("seed=11")
    k = _aligned_keys(fm, t, h, d, rng)
    q = np.concatenate([k[:12], rng.standard_normal((12, h, d)) * 4.0])
    v = rng.standard_normal((t, h, 3))
    with np.errstate(over="ignore"):  # the old, unshifted key features overflow float32
        assert np.isinf(np.exp(np.float32(fm.exponent_bound(d))))
    ref64 = textbook_causal(fm, q, k, v, 1e-6)
    assert np.all(np.isfinite(ref64))
    kf = fm(k.astype(np.float32))
    assert kf.dtype == np.float32 and np.all(np.isfinite(kf))
    assert float(np.log(np.max(kf * np.sqrt(4096)))) <= KEY_EXP_MAX + 1e-3
    for eps in (0.0, 1e-6):
        ref = textbook_causal(fm, q, k, v, eps)
        out, st = causal_linear_attention(
            q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
            feature_map=fm, eps=eps, backend=backend,
        )  # fmt: skip
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(st.S)) and np.all(np.isfinite(st.z))
        tol = tolerance(fm, np.concatenate([q, k]), v, np.float32)
        assert float(np.max(np.abs(out - ref))) <= tol, (eps, float(np.max(np.abs(out - ref))))


def test_key_shift_is_a_constant_of_the_parameters(wide_map):
    """b depends on W only: the same for any data, 0 where B fits (so small maps keep their
    states), and the carried state is exp(-b) times the textbook one."""
    fm = wide_map
    b = fm.key_shift(128)
    assert b == pytest.approx(fm.exponent_bound(128) - KEY_EXP_MAX)
    assert FavorPlus(num_features=64, seed=1).key_shift(16) == 0.0
    rng = np.random.default_rng(3)
    k = rng.standard_normal((5, 1, 128))
    v = rng.standard_normal((5, 1, 2))
    _, st = causal_linear_attention(k, k, v, feature_map=fm, backend="numpy")
    s_textbook = np.einsum("thf,thd->hfd", textbook_phi(fm, k), v)
    np.testing.assert_allclose(st.S * np.exp(b), s_textbook, rtol=1e-9, atol=1e-300)


def test_huge_queries_with_eps_zero_stay_a_ratio():
    """|x'| so large that exp(-s - b) overflows float64: eps = 0 must not turn into 0·inf."""
    fm = FavorPlus(num_features=16, seed=1)
    rng = np.random.default_rng(13)
    print("seed=13")
    q = rng.standard_normal((6, 1, 8)) * 60.0
    k = rng.standard_normal((6, 1, 8)) * 0.5
    v = rng.standard_normal((6, 1, 2))
    _, s = fm.query_and_shift(q)
    assert np.any(-s - fm.key_shift(8) > 710)  # exp would overflow float64
    for backend in ("numpy", "numba"):
        out, _ = causal_linear_attention(q, k, v, feature_map=fm, eps=0.0, backend=backend)
        assert np.all(np.isfinite(out)), backend
    assert np.all(np.isfinite(linear_attention(q, k, v, feature_map=fm, eps=0.0)))
