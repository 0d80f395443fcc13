"""The float32 mode's products by MKL's SGEMM (`linstream.ops.model.fla.mkl`, chosen by
`f32.choose_f32_products`: MKL on an Intel CPU where MKL is found, NumPy's
BLAS elsewhere; MKL's with each weight packed once at load, or on the weights as loaded with
LINSTREAM_F32_PRODUCTS=mkl-mapped; auto|mkl|mkl-mapped|numpy forces one), as a user meets them:
the load's line says which ran, a forward's bits do not depend on the thread count, and its
hidden states are the NumPy engine's to float32 rounding.  Skipped where the library is missing (the
NumPy engine is then the only one, and every other test runs it).

Tolerances:
- one product: each element of x @ wᵀ summed in float32 in any order is within
  γ_k · Σ_j |x_j w_j| of the exact sum, γ_k = k·u / (1 − k·u), u = 2⁻²⁴ (Higham's bound for
  a dot product of length k; it holds for every order and blocking a BLAS may choose).
- a forward: the engines compute the same float32 forward and differ only in the order of the
  products' sums (a packed weight's products block theirs as MKL chooses), so each one's error
  against the float64 mode is float32 rounding carried through the same layers; their errors
  are of one size (measured here: the MKL engines' rms error over the NumPy engine's 0.99-1.02
  over the families below), bounded at 3× the NumPy engine's.  A wrong product (a transposed
  weight, a column range missed or written twice) moves the hidden states by O(1) and fails it
  by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line, write_texts
from helpers.fla_folders import TINY_CONFIGS, write_folder
from helpers.streaming import stream_hidden_states
from linstream.ops.model.fla import ModelFolderError, avx512, load_model, mkl
from linstream.ops.model.fla.f32 import F32_ENV, choose_f32_products

SEED = 20261205


def _mkl_or_skip() -> None:
    try:
        mkl.library()
    except mkl.MKLUnavailable as ex:
        pytest.skip(str(ex))


def test_one_mkl_product_is_within_the_dot_products_rounding_bound():
    """Row ranges, column ranges of a wider output, k from 1 to 2,000; and a layout MKL cannot
    take is one line."""
    _mkl_or_skip()
    rng = np.random.default_rng(SEED)
    print("seed", SEED)
    u = 2.0**-24
    for m, k, n in [(1, 1, 1), (3, 7, 5), (64, 768, 300), (200, 2000, 64), (5, 33, 1000)]:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        exact = x.astype(np.float64) @ w.T.astype(np.float64)
        bound = (k * u / (1 - k * u)) * (np.abs(x).astype(np.float64) @ np.abs(w).T)
        wide = np.full((m, n + 9), np.nan, np.float32)
        c = slice(4, 4 + n)
        mkl.sgemm_rows(x, w, wide[:, c])  # the columns of a wider output, as a range writes
        assert np.all(np.abs(wide[:, c] - exact) <= bound), (m, k, n)
        assert np.isnan(wide[:, :4]).all() and np.isnan(wide[:, 4 + n :]).all()
        half = m // 2
        rows = np.empty((m, n), np.float32)
        mkl.sgemm_rows(x[:half], w, rows[:half])
        mkl.sgemm_rows(x[half:], w, rows[half:])
        assert np.all(np.abs(rows - exact) <= bound), (m, k, n)
    with pytest.raises(ValueError, match="expected a C-contiguous float32 x") as info:
        mkl.sgemm_rows(x.T, w, np.empty((k, n), np.float32))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("engine", ["avx512", "mkl", "mkl-mapped"])
def test_the_packing_engines_bits_do_not_depend_on_the_thread_count(tmp_path, monkeypatch, engine):
    """The products run in the runtime's ranges (MKL at one thread): the same bits on 1, 2 or 3
    threads (a 100-token chunk: its products' columns in ranges; then a 4,400-token chunk: four
    row ranges), the weights packed (the AVX-512 kernel, MKL) or as loaded."""
    from linstream.ops.model import blas

    if engine == "avx512":
        if avx512.reason_unavailable("float32") is not None:
            pytest.skip(f"the AVX-512 kernel: {avx512.reason_unavailable('float32')}")
    else:
        _mkl_or_skip()
    cfg = {**TINY_CONFIGS["gla"], "hidden_size": 128, "num_heads": 2}
    folder = write_folder(tmp_path / "m", cfg, dtype="BF16")
    monkeypatch.setenv(F32_ENV, engine)
    model = load_model(folder)
    ids = np.random.default_rng(3).integers(0, 50, 4400)
    for chunk in (ids[:100], ids):
        runs = []
        for threads in (1, 2, 3):
            monkeypatch.setattr(blas._single_threaded_blas, "_threads", threads)
            runs.append(model.embed_chunk(chunk, None))
        for emb, st in runs[1:]:
            assert np.array_equal(emb, runs[0][0])
            for a, b in zip(st, runs[0][1], strict=True):
                assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family", ["gla", "delta_net", "rwkv7", "mamba2"])
def test_both_float32_engines_compute_the_same_forward(tmp_path, family, monkeypatch):
    """300 tokens split as a stream (a chunk of two row ranges, short chunks of column ranges):
    each engine's error against the float64 mode, the AVX-512 kernel's and the MKL engines'
    (packed weights, and the weights as loaded) within 3× the NumPy engine's (module
    docstring), and not its bits (the engine really ran)."""
    lines = {"numpy": "by NumPy's BLAS"}
    if avx512.reason_unavailable("float32") is None:
        lines["avx512"] = "by linstream's AVX-512 kernel, the weights packed once at load"
    try:
        mkl.library()
    except mkl.MKLUnavailable:
        pass
    else:
        packed = "the weights packed once at load" if mkl.can_pack(np.float32) else "as loaded"
        lines.update({"mkl": packed, "mkl-mapped": "by MKL's SGEMM on the weights as loaded"})
    if len(lines) == 1:
        pytest.skip("neither MKL nor the AVX-512 kernel here: NumPy's BLAS is the one engine")
    if family not in TINY_CONFIGS:
        pytest.skip(f"no tiny {family} config")
    folder = write_folder(tmp_path / family, TINY_CONFIGS[family], seed=5)
    ids = np.random.default_rng(SEED).integers(0, 50, 400)
    bounds = [0, 1, 60, 360, 400]
    exact, _ = stream_hidden_states(load_model(folder, compute_dtype="float64"), ids, bounds)
    got = {}
    for engine, line in lines.items():
        monkeypatch.setenv(F32_ENV, engine)
        model = load_model(folder)
        assert line in model.load_report.products
        got[engine], _ = stream_hidden_states(model, ids, bounds)

    def rms(a):
        return float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))

    err = {e: rms(np.concatenate(h) - np.concatenate(exact)) for e, h in got.items()}
    print(family, err)
    for engine in set(lines) - {"numpy"}:
        assert 0 < err[engine] <= 3 * err["numpy"]
        assert not all(np.array_equal(a, b) for a, b in zip(got[engine], got["numpy"], strict=True))


def test_the_engine_is_chosen_by_the_cpu_and_the_variable(tmp_path, monkeypatch):
    """auto: MKL on an Intel CPU only (where the library is found), the AVX-512 kernel on
    another with AVX-512; numpy always NumPy's;
    the load's line says which ran; an unknown value is one line, in Python and on the
    command line (exit 2, no traceback)."""
    amd, intel = tmp_path / "amd", tmp_path / "intel"
    amd.write_text("processor : 0\nvendor_id : AuthenticAMD\nflags : fpu avx2\n")
    intel.write_text("processor : 0\nvendor_id : GenuineIntel\nflags : fpu avx512f\n")
    kernel = avx512.reason_unavailable("float32") is None  # this host's AVX-512
    assert choose_f32_products("auto", str(amd)).name == ("avx512" if kernel else "numpy")
    assert choose_f32_products("numpy", str(intel)).name == "numpy"
    try:
        mkl.library()
    except mkl.MKLUnavailable:
        assert choose_f32_products("auto", str(intel)).name == "numpy"
        with pytest.raises(mkl.MKLUnavailable):
            choose_f32_products("mkl", str(amd))
    else:
        auto = choose_f32_products("auto", str(intel))
        assert auto.name == "mkl" and auto.packs == mkl.can_pack(np.float32)
        assert choose_f32_products("mkl", str(amd)).name == "mkl"
        mapped = choose_f32_products("mkl-mapped", str(intel))
        assert mapped.name == "mkl" and not mapped.packs
    folder = write_folder(tmp_path / "m", TINY_CONFIGS["gla"])
    monkeypatch.setenv(F32_ENV, "numpy")
    assert "float32 products by NumPy's BLAS" in str(load_model(folder).load_report)
    monkeypatch.setenv(F32_ENV, "fast")
    with pytest.raises(ModelFolderError) as info:
        load_model(folder)
    msg = str(info.value)
    assert "\n" not in msg
    assert f"{F32_ENV}='fast': expected one of auto, avx512, mkl, mkl-mapped, numpy" in msg
    monkeypatch.delenv(F32_ENV)
    texts = write_texts(tmp_path / "texts", {"a.txt": "hello"})
    done = linstream(
        "embed", "--input", texts, "--output", tmp_path / "out", "--model", folder,
        "--progress-every", "0", env={F32_ENV: "fast"},
    )  # fmt: skip
    line = one_error_line(done)
    print(line)
    assert done.returncode == 2 and f"{F32_ENV}='fast'" in line
