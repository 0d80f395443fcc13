"""The packed products (`mkl.Packed`: MKL packs each weight once, at load; bfloat16 weights with
Intel's mkl package, float32 ones with either library), as a user meets them: the load's line
says the weights are packed, the products are within the rounding bound of the exact product of
the operands, a forward's bits do not depend on the thread count, and its hidden states are the
unpacked engine's to float32 rounding (and the bfloat16 roundings that moves).  Where the
library cannot pack bfloat16 weights (PyTorch's copy of MKL) the engine says so and keeps the
mapped weights; it still packs the float32 mode's.  Skipped where the library cannot pack (the
float32 forward's packed and unpacked engines: tests/ops/fla/test_fla_f32_products.py).

Tolerances:
- one product: MKL's float32 dot product of length k (bfloat16 operands: each x_j·w_j exact in
  float32; float32 ones: each rounded once) is within γ_k · Σ_j |x_j w_j| of the exact one,
  γ_k = k·u / (1 − k·u), u = 2⁻²⁴, whatever its order and blocking (Higham's bound for a dot
  product).
- a forward: packed and unpacked products sum the same bfloat16 operands in float32, so they
  differ by float32 rounding, and where that moves a value across a bfloat16 rounding boundary,
  by one rounding step of the next product's input (2⁻⁸ of it) — a flip, which the layers after
  it carry on.  The mode's own error against the float32 mode is every product input's rounding
  (each up to half a step, rms step/√12).  In the linear regime independent perturbations add
  in quadrature, so k flips among a forward's N rounded inputs move the outputs by about
  √(12k/N) of the mode's error, which stays below it while fewer than 1 in 12 inputs flips.  A
  float32 difference δ flips its input with probability about |δ|/step: 2⁻¹⁶ for a difference
  of one float32 rounding (2⁻²⁴ of the value; the delta kernel's outputs on the two engines'
  inputs differ by ~1e-7 of their largest), and still only 1 in 16 for one of 2⁻¹² (4,096
  roundings).  So the bound is the mode's error itself (the float32 mode on NumPy's BLAS, which
  shares no code with MKL's packing); a product that is wrong moves the outputs by far more (one
  output column of each packed range left at 0: 19-23x the mode's error, tried), and fails it.
  Measured here: the ratio is 1e-6 where no input flips (GLA, RWKV-7, Mamba-2) and 1e-3 to 0.13
  on DeltaNet, whose flips depend on the delta kernel's float32 rounding (a bound of 0.1 of the
  mode's error, here before, passed or failed by which inputs flipped).
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from helpers.fla_folders import TINY_CONFIGS, write_folder
from helpers.mkl_engines import can_pack
from helpers.streaming import stream_hidden_states
from linstream.ops.model.fla import load_model, mkl
from linstream.ops.model.fla.bf16 import ENV
from linstream.ops.model.fla.f32 import F32_ENV

SEED = 20261205
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def packing() -> None:
    if not can_pack("bfloat16"):
        pytest.skip("MKL cannot pack bfloat16 weights here (Intel's mkl package is not installed)")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_packed_products_are_within_the_dot_products_rounding_bound(dtype):
    """Column ranges packed apart and written into a wider output, row ranges of a bigger x,
    k from 1 to 2,000, 1 to 2,048 rows; a layout MKL cannot take is one line."""
    if not can_pack(dtype):
        pytest.skip(f"MKL cannot pack {dtype} weights here")
    dt = BF16 if dtype == "bfloat16" else np.dtype(np.float32)
    unpacked_rows = mkl.bf16_rows if dtype == "bfloat16" else mkl.sgemm_rows
    rng = np.random.default_rng(SEED)
    print("seed", SEED)
    u = 2.0**-24
    for m, k, n in [(1, 1, 1), (3, 7, 5), (64, 768, 300), (200, 2000, 64), (2048, 96, 130)]:
        x = rng.standard_normal((m + 2, k), dtype=np.float32).astype(dt)
        w = rng.standard_normal((n, k), dtype=np.float32).astype(dt)
        xs = x[1 : m + 1]  # a range of a bigger array's rows
        x64, w64 = xs.astype(np.float64), w.astype(np.float64)
        exact = x64 @ w64.T
        bound = (k * u / (1 - k * u)) * (np.abs(x64) @ np.abs(w64).T)
        cuts = [0, n // 3, n // 3, n]  # one range empty
        ranges = [slice(a, b) for a, b in itertools.pairwise(cuts)]
        packed = mkl.Packed(w, ranges)
        assert packed.nbytes == w.nbytes
        assert sum(a.nbytes for a in packed.arrays()) == w.nbytes
        wide = np.full((m, n), np.nan, np.float32)
        for j in range(len(ranges)):
            packed.rows(xs, j, wide)
        assert np.all(np.abs(wide - exact) <= bound), (m, k, n)
        unpacked = np.empty((m, n), np.float32)
        unpacked_rows(np.ascontiguousarray(xs), w, unpacked)
        assert np.all(np.abs(unpacked - exact) <= bound), (m, k, n)
    with pytest.raises(ValueError, match=f"expected a C-contiguous {dtype} x") as info:
        packed.rows(x.T, 0, np.empty((k, n), np.float32))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("family", ["gla", "delta_net", "rwkv7", "mamba2"])
def test_packed_forward_is_the_unpacked_one_to_float32_rounding(
    tmp_path, monkeypatch, packing, family
):
    """Streamed in pieces (1, 299 and 100 tokens: short chunks' columns, a long chunk's rows)."""
    folder = write_folder(tmp_path / family, TINY_CONFIGS[family], dtype="BF16", seed=5)
    ids = np.random.default_rng(SEED).integers(0, 50, 400)
    bounds = [0, 1, 300, 400]
    monkeypatch.setenv(ENV, "mkl")
    packed = load_model(folder, compute_dtype="bfloat16")
    monkeypatch.setenv(ENV, "mkl-mapped")
    mapped = load_model(folder, compute_dtype="bfloat16")
    assert "the weights packed once at load" in packed.load_report.products
    assert "the mapped weights reformatted at each product" in mapped.load_report.products
    assert packed.load_report.mapped_bytes < mapped.load_report.mapped_bytes
    got, _ = stream_hidden_states(packed, ids, bounds)
    want, _ = stream_hidden_states(mapped, ids, bounds)
    monkeypatch.setenv(F32_ENV, "numpy")  # the reference shares no code with MKL's packing
    f32, _ = stream_hidden_states(load_model(folder), ids, bounds)
    for a, b, c in zip(got[1:], want[1:], f32[1:], strict=True):  # [0]: the embeddings
        diff = _rms(a - b)
        mode = _rms(b - c)
        print(family, "rms(packed - unpacked) / rms(unpacked - float32 mode)", diff / mode)
        assert diff <= mode


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))


def test_a_library_that_cannot_pack_keeps_the_mapped_weights(tmp_path, monkeypatch):
    """PyTorch's copy of MKL has no bfloat16 packing: the engine says so and the weights stay
    mapped; it packs float32 weights (the float32 mode's line says so)."""
    pytest.importorskip("torch")
    monkeypatch.setattr(mkl, "_package_library", lambda: None)
    mkl._loaded.cache_clear()
    try:
        assert mkl.source() == "PyTorch's CPU library" and not mkl.can_pack()
        folder = write_folder(tmp_path / "m", TINY_CONFIGS["gla"], dtype="BF16")
        monkeypatch.setenv(ENV, "mkl")
        model = load_model(folder, compute_dtype="bfloat16")
        line = model.load_report.products
        assert "the mapped weights reformatted at each product (PyTorch's CPU library)" in line
        assert model.load_report.mapped_bytes > model.load_report.held_bytes * 0.9
        assert mkl.can_pack(np.float32)
        monkeypatch.setenv(F32_ENV, "mkl")  # (auto picks MKL on Intel CPUs only)
        line = load_model(folder).load_report.products
        assert "the weights packed once at load (PyTorch's CPU library)" in line
    finally:
        mkl._loaded.cache_clear()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_fused_projection_s_parts_packed_whole_give_the_column_ranges_bits(
    tmp_path, monkeypatch, dtype
):
    """The parts of a fused projection of several are packed as one range of columns each (a
    long chunk's row ranges then multiply the whole width); their products, and so a forward
    streamed in short and long chunks, have the bits of the parts packed per range of columns,
    as a lone product is (k below 1,024: MKL's packed product is its SGEMM's there)."""
    if not can_pack(dtype):
        pytest.skip(f"MKL cannot pack {dtype} weights here")
    from linstream.ops.model.fla import dense

    wide = {"hidden_size": 256, "num_heads": 4, "intermediate_size": 512}  # 2 column ranges
    cfg = {**TINY_CONFIGS["delta_net"], **wide}
    folder = write_folder(tmp_path / "dn", cfg, dtype="BF16", seed=5)
    ids = np.random.default_rng(SEED).integers(0, 50, 700)
    bounds = [0, 64, 600, 700]  # a short chunk, a long one (row ranges), a short one
    whole = load_model(folder, compute_dtype=dtype)

    def per_columns(self, parts):  # every part packed per range of its columns
        return dense.FusedProjection({name: self.dense(w) for name, w in parts})

    monkeypatch.setattr(dense.Weights, "fused", per_columns)
    columns = load_model(folder, compute_dtype=dtype)
    # the two loads did pack differently (else this would compare a load with itself)
    one, several = (m._blocks[0].gate_up.parts["gate"] for m in (whole, columns))
    assert len(one.packed.ranges) == 1 and len(several.packed.ranges) == 2
    got, _ = stream_hidden_states(whole, ids, bounds)
    want, _ = stream_hidden_states(columns, ids, bounds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
