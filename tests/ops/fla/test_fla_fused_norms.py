"""The fused norm and gate passes (`fused.rms_norm`, `add_rms_norm`, `head_norm`, `l2_heads`,
`log_gate`) and the short convolution (`fused.short_conv`)
equal the unfused NumPy expressions they replace, within derived roundoff bounds; their serial
and parallel versions give the same bits; and a float32 forward hands every product a
C-contiguous float32 input (nothing converts or copies on the way to BLAS)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.fla_folders import TINY_CONFIGS, write_folder
from linstream.ops.model.fla import dense, fused, load_model, pieces

SEED = 20261204
DTYPES = [np.float32, np.float64]


def _u(dtype):
    return float(np.finfo(dtype).eps) / 2  # unit roundoff


def _rms_ref(x, w, eps):
    """pieces' NumPy expression, in float64 (the exact value to the compute dtype's roundoff)."""
    x = np.asarray(x, np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * np.asarray(w, np.float64)


def _rel_err(got, want):
    # per row relative to the row's largest output (a sum of d squares' rounding scales with it)
    scale = np.abs(want).max(axis=-1, keepdims=True)
    return float((np.abs(got - want) / scale).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_equals_numpy(dtype, weighted):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, d, eps = 300, 96, 1e-5
    x = (3.0 * rng.standard_normal((t, d)) + 0.5).astype(dtype)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype) if weighted else None
    got = fused.rms_norm(x, w, eps)
    assert got.dtype == dtype and got.flags.c_contiguous
    # a sum of d squares and a few operations more: within (d + 8) unit roundoffs (as
    # test_fla_norms' bound against torch), relative to the row's largest output
    assert _rel_err(got, _rms_ref(x, w, eps)) <= (d + 8) * _u(dtype)
    # the unfused NumPy expression in the compute dtype itself: the same bound twice over
    ms = np.einsum("td,td->t", x, x) / d
    numpy_y = x * (1.0 / np.sqrt(ms + eps))[:, None].astype(dtype)
    if w is not None:
        numpy_y = numpy_y * w
    assert _rel_err(got, numpy_y.astype(np.float64)) <= 2 * (d + 8) * _u(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_is_the_sum_and_its_norm(dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, d, eps = 257, 64, 1e-6
    x, a = (rng.standard_normal((t, d)).astype(dtype) for _ in range(2))
    x_before = x.copy()
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    h, y = pieces.add_rms_norm(x, a, w, eps)
    np.testing.assert_array_equal(x, x_before)  # the input is not written
    np.testing.assert_array_equal(h, x + a)  # one rounding each: NumPy's very bits
    assert _rel_err(y, _rms_ref(h, w, eps)) <= (d + 8) * _u(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [True, False])
def test_head_norm_of_the_head_major_output_equals_numpy(dtype, gated):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    h, t, d, eps = 3, 130, 48, 1e-5
    heads = (2.0 * rng.standard_normal((h, t, d))).astype(dtype)  # the recurrence's [H, T, d]
    o = heads.transpose(1, 0, 2)  # as the families hand it: a view [T, H, d]
    gate = rng.standard_normal((t, h * d)).astype(dtype).reshape(t, h, d) if gated else None
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    got = pieces.head_norm(o, w, eps, gate, "swish")
    assert got.flags.c_contiguous  # the output projection reads [T, H·d] without a copy
    want = _rms_ref(o, w, eps)
    bound = (d + 8) * _u(dtype)
    if gated:
        g = gate.astype(np.float64)
        want = want * (g / (1.0 + np.exp(-g)))
        bound += 8 * _u(dtype)  # the sigmoid: an exp of ~1 ulp (numba_tools.exp_f32), + 1, /
    assert _rel_err(got.reshape(t, -1), want.reshape(t, -1)) <= bound


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("clamp", "repeat"), [(None, 1), (-0.3, 2)])
def test_log_gate_equals_numpy_logsigmoid_head_major(dtype, clamp, repeat):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, heads, d, n = 200, 3, 16, 16.0
    # gates from saturated to tiny: e^−|v| from 1 down to below float32's smallest normal
    z = (rng.standard_normal((t, heads * d)) * np.logspace(-3, 2.1, heads * d)).astype(dtype)
    b = rng.standard_normal(heads * d).astype(dtype)
    got = pieces.log_gate(z, b, n, clamp, d, repeat)
    assert got.shape == (heads * repeat, t, d) and got.dtype == dtype
    v = (z + b).astype(np.float64)  # the sum in the dtype first, as the kernel and NumPy
    m, lp = np.minimum(v, 0.0), np.log1p(np.exp(-np.abs(v)))
    want = (m - lp) / n
    if clamp is not None:
        want = np.maximum(want, clamp)
    want = np.repeat(want.reshape(t, heads, d).transpose(1, 0, 2), repeat, axis=0)
    # exp (~1 ulp), log1p by its series (rest < 2e-9 relative) or libm, the subtraction and
    # the division: each a few unit roundoffs of |m| + log1p, the terms of the difference
    scale = np.repeat(((np.abs(m) + lp) / n).reshape(t, heads, d).transpose(1, 0, 2), repeat, 0)
    # plus the smallest normal number: exp_f32 stops there (e^−|v| of 1.2e-38, not a
    # subnormal or 0), a gate of −7e-40 instead of ~0
    tiny = float(np.finfo(dtype).tiny)
    err = np.abs(got - want) - 8 * _u(dtype) * scale
    assert err.max() <= tiny, float(err.max())
    # and NumPy's own expression in the compute dtype (pieces.logsigmoid), the same bound
    numpy_g = pieces.logsigmoid(z + b) / dtype(n)
    if clamp is not None:
        numpy_g = np.maximum(numpy_g, dtype(clamp))
    numpy_g = np.repeat(numpy_g.reshape(t, heads, d).transpose(1, 0, 2), repeat, axis=0)
    assert (np.abs(got - numpy_g) - 16 * _u(dtype) * scale).max() <= tiny


@pytest.mark.parametrize("dtype", DTYPES)
def test_l2_heads_equals_numpy_l2_norm_of_the_heads(dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, heads, d, scale = 150, 4, 32, 32**-0.5
    x = (rng.standard_normal((t, heads * d)) * rng.uniform(0.01, 5.0, (t, 1))).astype(dtype)
    got = pieces.l2_heads(x, d, scale)
    assert got.shape == (heads, t, d) and got.dtype == dtype
    hm = x.astype(np.float64).reshape(t, heads, d).transpose(1, 0, 2)
    want = hm / np.sqrt((hm * hm).sum(-1, keepdims=True) + 1e-6) * np.float64(dtype(scale))
    # a sum of d squares and three operations more (fla's l2norm formula, eps inside the root)
    assert _rel_err(got, want) <= (d + 8) * _u(dtype)
    # the unfused NumPy pieces it replaces: head_major, l2_norm, the scale
    numpy_h = pieces.l2_norm(np.ascontiguousarray(x.reshape(t, heads, d).transpose(1, 0, 2)))
    numpy_h *= dtype(scale)
    assert _rel_err(got, numpy_h.astype(np.float64)) <= 2 * (d + 8) * _u(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [2, 4, 5])
@pytest.mark.parametrize("t", [1, 3, 4, 200])
def test_short_conv_is_torch_conv1d_over_the_tail_and_the_chunk(dtype, width, t):
    """`fused.conv` (width 4, fla's and Mamba-2's, has a pass of its own from the chunk's fourth
    row on), with and without a bias: the last t outputs of PyTorch's causal depthwise
    convolution (+ SiLU) over the carried tail and the chunk, each within (W + 9) roundings of
    its terms' magnitudes (a sum of W products and the bias, then SiLU's few operations), the
    serial and parallel kernels the same bits; `short_conv` the same bits as `conv` without a
    bias, and its new tail the last W − 1 raw inputs."""
    torch = pytest.importorskip("torch")
    from linstream.ops.numba_tools import only_version

    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED + t + width)
    d = 72
    x = rng.standard_normal((t, d)).astype(dtype)
    tail = rng.standard_normal((width - 1, d)).astype(dtype)
    w = rng.standard_normal((d, width)).astype(dtype)
    full = np.concatenate([tail, x]).astype(np.float64)  # [W−1+t, d]
    n = full.shape[0] - width + 1
    size = sum(np.abs(w[:, j]) * np.abs(full[j : j + n]) for j in range(width))  # Σ |terms|
    for bias in (None, rng.standard_normal(d).astype(dtype)):
        conv = (
            torch.nn.functional.conv1d(
                torch.from_numpy(full.T[None]),
                torch.from_numpy(w.astype(np.float64)[:, None]),
                None if bias is None else torch.from_numpy(bias.astype(np.float64)),
                groups=d,
            )[0]
            .numpy()
            .T
        )
        terms = size if bias is None else size + np.abs(bias)
        for silu in (False, True):
            want = conv / (1 + np.exp(-conv)) if silu else conv
            outs = []
            for parallel in (False, True):
                with only_version(parallel):
                    outs.append(fused.conv(x, tail, w, bias, silu))
            got = outs[0]
            assert got.dtype == dtype and got.shape == (t, d)
            assert np.all(np.abs(got - want) <= (width + 9) * _u(dtype) * (terms + np.abs(want)))
            np.testing.assert_array_equal(outs[0], outs[1])
            if bias is None:
                short, new_tail = fused.short_conv(x, tail, w, silu)
                np.testing.assert_array_equal(short, got)
                np.testing.assert_array_equal(new_tail, full[-(width - 1) :].astype(dtype))


def test_the_thread_count_changes_no_bit():
    """Each output row is computed on its own, in its own order: the parallel version on one
    thread and on two gives the same bits (which version runs is fixed by the array's size)."""
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    x, a = (rng.standard_normal((64, 40)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(40).astype(np.float32)
    eps = np.float32(1e-5)
    outs = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            y = np.empty_like(x)
            fused._RMS[True](x, w, eps, y)
            h2, y2 = np.empty_like(x), np.empty_like(x)
            fused._ADD_RMS[True](x, a, w, eps, h2, y2)
            heads = x.reshape(64, 4, 10).transpose(1, 0, 2).copy()
            hn = np.empty((64, 4, 10), np.float32)
            fused._HEAD_NORM[True](heads, w[:10].copy(), eps, a.reshape(64, 4, 10), True, hn)
            lg = np.empty((8, 64, 5), np.float32)
            fused._LOG_GATE[True](x, w, np.float32(16), np.float32(-np.inf), 1, lg)
            l2 = np.empty((4, 64, 10), np.float32)
            fused._L2_HEADS[True](x, np.float32(1e-6), np.float32(0.3), l2)
            outs.append([y, h2, y2, hn, lg, l2])
    finally:
        numba.set_num_threads(before)
    for one, two in zip(*outs, strict=True):
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("family", ["gla", "delta_net"])
def test_every_float32_product_gets_a_contiguous_float32_input(tmp_path, family, monkeypatch):
    """No hidden astype or transposed copy before BLAS: each Dense's input is C-contiguous in
    the compute dtype (a non-contiguous x would be copied inside matmul)."""
    cfg = {**TINY_CONFIGS[family], "use_short_conv": False}
    folder = write_folder(tmp_path / family, cfg, seed=SEED)
    model = load_model(folder, compute_dtype="float32")
    seen: list[tuple[str, bool]] = []
    call = dense.Dense.__call__

    def recorded(self, x):
        seen.append((x.dtype.name, bool(x.flags.c_contiguous)))
        return call(self, x)

    monkeypatch.setattr(dense.Dense, "__call__", recorded)
    ids = np.random.default_rng(SEED).integers(0, cfg["vocab_size"], 300)
    model.embed_chunk(ids, None)
    assert seen and all(s == ("float32", True) for s in seen), seen


@pytest.mark.parametrize("parallel", [False, True])
def test_the_rounded_passes_write_the_float32_pass_rounded_to_bfloat16(parallel):
    """`add_rms_norm` and `swiglu` with rounded=True (the bfloat16 mode's MLP inputs) write
    bfloat16: the float32 pass's value rounded to nearest, so within half a bfloat16 step
    (2⁻⁸ relative: 8 significant bits) of the float32 pass's output, plus the float32
    rounding by which the two passes' value may differ (reassociated: the norm's sum of d
    squares, 2·d·u; the SwiGLU's four operations, 8·u; u = 2⁻²⁴).  Each kernel's serial and
    parallel version (one kernel writes both outputs)."""
    from linstream.ops.numba_tools import only_version

    print(f"seed={SEED}")
    with only_version(parallel):
        _rounded_passes()


def _rounded_passes() -> None:
    from linstream.ops.model.fla.bf16 import BF16

    rng = np.random.default_rng(SEED)
    t, d, eps, u = 300, 96, 1e-5, 2.0**-24
    x, a = (rng.standard_normal((t, d), dtype=np.float32) for _ in range(2))
    w = rng.standard_normal(d, dtype=np.float32)
    h, want = fused.add_rms_norm(x, a, w, eps)
    h2, got = fused.add_rms_norm(x, a, w, eps, rounded=True)
    assert got.dtype == BF16 and h2.dtype == np.float32
    np.testing.assert_array_equal(h2, h)
    bound = (2.0**-8 + 2 * d * u) * np.abs(want)
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound)
    g, up = (rng.standard_normal((t, 2 * d), dtype=np.float32) for _ in range(2))
    want = fused.swiglu(g, up)
    got = fused.swiglu(g, up, rounded=True)
    assert got.dtype == BF16
    assert np.all(np.abs(got.astype(np.float64) - want) <= (2.0**-8 + 8 * u) * np.abs(want))


@pytest.mark.parametrize(("engine", "rounded"), [("widen", False), ("rounding", True)])
def test_the_bfloat16_mlp_gets_its_inputs_rounded_by_the_pass_before_it(
    tmp_path, monkeypatch, engine, rounded
):
    """In the bfloat16 mode on an engine that rounds its inputs (the AVX512-BF16 kernel, MKL),
    the MLP's two products get bfloat16 inputs from the norm and the SwiGLU passes (no rounding
    pass of their own); on the widening engine, float32 ones."""
    from linstream.ops.model.fla import avx512
    from linstream.ops.model.fla.bf16 import ENV

    if engine == "rounding":
        if avx512.reason_unavailable() is None:
            engine = "avx512bf16"
        else:
            pytest.importorskip("mkl", reason="no bfloat16 engine that rounds its inputs here")
            engine = "mkl-mapped"
    monkeypatch.setenv(ENV, engine)
    folder = write_folder(tmp_path / "m", TINY_CONFIGS["gla"], dtype="BF16", seed=SEED)
    model = load_model(folder, compute_dtype="bfloat16")
    seen: list[str] = []
    call = dense.Dense.__call__

    def recorded(self, x):
        seen.append(x.dtype.name)
        return call(self, x)

    monkeypatch.setattr(dense.Dense, "__call__", recorded)
    fused_call = dense.FusedProjection.__call__

    def recorded_fused(self, x):
        seen.append(x.dtype.name)
        return fused_call(self, x)

    monkeypatch.setattr(dense.FusedProjection, "__call__", recorded_fused)
    model.embed_chunk(np.arange(300) % 50, None)
    layers = len(model._blocks)
    # per layer: the mixer's products (float32 input), gate_up and down (the MLP's)
    mlp = [name for i, name in enumerate(seen) if name == "bfloat16"]
    assert len(mlp) == (2 * layers if rounded else 0), seen
