"""Mamba-2's fused passes (`linstream.ops.model.fla.mamba2_passes`) against the libraries' own:
the gated RMSNorm against fla's `rms_norm_ref` (fla.modules.layernorm_gated, the reference of
the RMSNormGated that fla's and transformers' Mamba-2 run) in its three modes, and the
convolution with SiLU against PyTorch's depthwise `conv1d` over the carried tail and the chunk.
Inputs are column ranges of one wider array, as the runtime hands them over (views of the
in-projection's output).

Tolerance, derived from the dtype: each output is a few roundings of the compute dtype away from
the float64 reference (the gate's SiLU with the float32 exp polynomial of ~1 ulp, a product, the
reciprocal square root of a float64 mean, two more products; the convolution's W products and
sums), so |out − ref| ≤ 8 · u · max|ref| (u the unit roundoff; 8 = 3 bits for those roundings).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fla", reason="fla is a test extra (make test installs it)")

from fla.modules.layernorm_gated import rms_norm_ref  # noqa: E402
from linstream.ops.model.fla.mamba2_passes import conv_silu, gated_norm  # noqa: E402

SEED = 20261204
FACTOR = 8


def unit(dtype) -> float:
    return float(np.finfo(dtype).eps) / 2


def columns(rng, t: int, widths: list[int], dtype) -> list[np.ndarray]:
    """Column ranges of one [t, Σ widths + 5] array (strided views, as the in-projection's)."""
    wide = (2.0 * rng.standard_normal((t, sum(widths) + 5))).astype(dtype)
    bounds = np.cumsum([0, *widths])
    return [wide[:, a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("mode", ["gate_then_norm", "norm_then_gate", "gate"])
def test_gated_norm_equals_fla_reference(mode, groups, dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    t, d = 37, 96
    z, y = columns(rng, t, [d, d], dtype)
    assert not y.flags.c_contiguous and not z.flags.c_contiguous
    # float32 values: rms_norm_ref casts the weight to float32 whatever the inputs' dtype
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32).astype(dtype)
    got = gated_norm(y, z, None if mode == "gate" else w, groups, 1e-5, mode)
    assert got.dtype == dtype and got.shape == (t, d)
    ty, tz = (torch.from_numpy(np.asarray(a, np.float64)) for a in (y, z))
    if mode == "gate":
        ref = (ty * torch.nn.functional.silu(tz)).numpy()
    else:
        ref = rms_norm_ref(
            ty, torch.from_numpy(w.astype(np.float64)), None, z=tz, eps=1e-5,
            group_size=d // groups, norm_before_gate=mode == "norm_then_gate", upcast=False,
        ).numpy()  # fmt: skip
    err = float(np.abs(got - ref).max())
    tol = FACTOR * unit(dtype) * float(np.abs(ref).max())
    print(f"error {err:.3g} (tolerance {tol:.3g})")
    assert err <= tol


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t", [1, 2, 3, 40])
def test_conv_silu_equals_torch_conv1d_over_the_tail_and_the_chunk(t, dtype):
    """A chunk of t tokens after a carried tail of W−1 = 3 raw inputs: the outputs are the last
    t of PyTorch's causal depthwise convolution (+ bias, SiLU) over tail and chunk, the new tail
    their last W−1 raw inputs (partly the old tail's when t < W−1)."""
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED + t)
    d, width = 24, 4
    [x] = columns(rng, t, [d], dtype)
    tail = rng.standard_normal((width - 1, d))
    w = rng.standard_normal((d, width)).astype(dtype)
    bias = rng.standard_normal(d).astype(dtype)
    got, new_tail = conv_silu(x, tail, w, bias)
    assert got.dtype == dtype and new_tail.dtype == tail.dtype
    full = np.concatenate([tail, np.asarray(x, np.float64)])  # [W−1+t, d]
    conv = torch.nn.functional.conv1d(
        torch.from_numpy(full.T[None]),
        torch.from_numpy(w.astype(np.float64)[:, None, :]),
        torch.from_numpy(bias.astype(np.float64)),
        groups=d,
    )  # no padding: the outputs of the last t positions
    ref = torch.nn.functional.silu(conv)[0].numpy().T
    assert ref.shape == (t, d)
    err = float(np.abs(got - ref).max())
    tol = FACTOR * unit(dtype) * float(np.abs(ref).max())
    print(f"error {err:.3g} (tolerance {tol:.3g})")
    assert err <= tol
    np.testing.assert_array_equal(new_tail, full[-(width - 1) :])
