"""A model's final norm of either kind (RMSNorm, LayerNorm with a bias) equals PyTorch's own."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from linstream.ops.model.fla.block import Norm, NormSpec  # noqa: E402
from linstream.ops.model.fla.dense import Weights  # noqa: E402

SEED = 20261202


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_a_norm_equals_torch(kind, dtype):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    d, eps = 96, 1e-5
    x = (3.0 * rng.standard_normal((7, d)) + 0.5).astype(dtype)
    w, b = 1.0 + 0.1 * rng.standard_normal(d), rng.standard_normal(d)
    tensors = {"norm.weight": w, "norm.bias": b}
    spec = NormSpec(kind, "norm.weight", "norm.bias" if kind == "layer" else None)
    norm = Norm.build(spec, tensors, Weights(dtype), eps=eps)
    got = norm(x)
    assert got.dtype == dtype
    t = torch.from_numpy(x.astype(np.float64))
    tw, tb = (torch.from_numpy(a.astype(dtype).astype(np.float64)) for a in (w, b))
    if kind == "rms":
        want = torch.nn.functional.rms_norm(t, (d,), tw, eps)
    else:
        want = torch.nn.functional.layer_norm(t, (d,), tw, tb, eps)
    # Against torch in float64: each output is a sum over d terms and a few operations more, so
    # within (d + 8) unit roundoffs of the compute dtype, relative to the row's largest output.
    u = float(np.finfo(dtype).eps) / 2
    scale = np.abs(want.numpy()).max(axis=1, keepdims=True)
    err = np.abs(got - want.numpy()) / scale
    assert err.max() <= (d + 8) * u, float(err.max())
