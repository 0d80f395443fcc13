"""The rule kernels' input gather runs serially for small chunks and in parallel for large ones:
both paths give the same bits, for every compiled-in map, with and without unit rows and ones."""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops import numba_tools
from linstream.ops.feature_maps import get_feature_map
from linstream.ops.rules import gather


@pytest.mark.parametrize("name", ["elu+1", "relu", "identity"])
@pytest.mark.parametrize(("unit", "ones"), [(False, False), (True, False), (False, True)])
def test_serial_and_parallel_gathers_agree(name, unit, ones, monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 3, 7)).astype(np.float32)
    x[5, 1] = 0.0  # a zero row stays zero when made unit
    fm = get_feature_map(name)
    monkeypatch.setattr(numba_tools, "_PARALLEL_MIN_WORK", 1 << 62)
    serial = gather.heads(x, fm, np.float32, unit=unit, ones=ones)
    monkeypatch.setattr(numba_tools, "_PARALLEL_MIN_WORK", 0)
    parallel = gather.heads(x, fm, np.float32, unit=unit, ones=ones)
    assert serial.shape == (3, 300, 7 + int(ones))
    np.testing.assert_array_equal(serial, parallel)
    expected = np.transpose(fm(x.astype(np.float64), xp=np), (1, 0, 2))
    if unit:
        n = np.linalg.norm(expected, axis=-1, keepdims=True)
        expected = np.divide(expected, n, out=np.zeros_like(expected), where=n > 0)
    # float32 rounding of the map (exp to ~1 ulp, the add) and of the row norm (7 squares summed
    # in float64, one multiply): a few ulps, bounded by 8.
    np.testing.assert_allclose(serial[..., :7], expected, rtol=8 * np.finfo(np.float32).eps, atol=0)
    if ones:
        assert (serial[..., 7] == 1).all()


def test_gather_runs_serially_below_65536_values(monkeypatch):
    """The measured choice (64 tokens of 8×64 heads: 84 µs serial, 152 µs in a parallel region)
    holds through the kernels' shared threshold: 32,768 values serial, 65,536 parallel."""
    used = []
    real = dict(gather._heads_kernels)
    monkeypatch.setattr(
        gather,
        "_heads_kernels",
        {p: (lambda *a, p=p: (used.append(p), real[p](*a))) for p in (False, True)},
    )
    fm = get_feature_map("elu+1")
    for t in (64, 128):
        gather.heads(np.zeros((t, 8, 64), np.float32), fm, np.float32)
    assert used == [False, True]
