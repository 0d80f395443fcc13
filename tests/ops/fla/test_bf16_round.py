"""The bfloat16 mode's rounding of a product's input (`bf16_round.to_bf16`) against ml_dtypes'
conversion (NumPy's cast to its bfloat16: round to nearest, ties to even), the outside oracle,
on every kind of float32: random bit patterns (both kernel versions: serial below the threads'
threshold, parallel above it), the ties, the largest finite values, infinities and NaNs."""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops.model.fla.bf16 import BF16
from linstream.ops.model.fla.bf16_round import to_bf16
from linstream.ops.numba_tools import only_version

SEED = 20261205


@pytest.mark.parametrize("parallel", [False, True])
def test_random_bit_patterns_round_as_ml_dtypes(parallel):
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    x = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x.reshape(600, 500)
    with only_version(parallel), np.errstate(invalid="ignore"):
        got = to_bf16(x)
        want = np.array(x, dtype=BF16)
    assert got.dtype == BF16 and got.shape == x.shape and got.flags.c_contiguous
    fin = ~np.isnan(x)
    assert np.array_equal(got.view(np.uint16)[fin], want.view(np.uint16)[fin])
    nan = got[~fin].astype(np.float32)
    assert np.isnan(nan).all()  # a NaN stays a NaN (never a carry into an infinity or zero)
    assert np.array_equal(np.signbit(nan), np.signbit(x[~fin]))


def test_ties_overflow_and_special_values():
    bits = np.array(
        [
            0x3F808000,  # 1 + 2^-8: a tie, bit 16 even -> down
            0x3F818000,  # a tie with bit 16 odd -> up
            0x3F808001,  # just past a tie -> up
            0x7F7F7FFF,  # below the largest bfloat16's rounding boundary -> 0x7F7F
            0x7F7F8000,  # the boundary: a tie on an odd bit -> inf
            0x7F7FFFFF,  # float32's largest -> inf
            0x7F800000,  # inf
            0xFF800000,  # -inf
            0x80000000,  # -0
            0x00000001,  # the smallest subnormal -> 0
            0x007FFFFF,  # the largest subnormal -> rounds up to the smallest normal
            0x7FFFFFFF,  # a NaN whose sum would carry into the sign
            0xFFC00001,  # a negative quiet NaN
        ],
        np.uint32,
    ).view(np.float32)
    got = to_bf16(bits).view(np.uint16)
    with np.errstate(invalid="ignore"):
        want = np.array(bits, dtype=BF16).view(np.uint16)
    assert np.array_equal(got[:-2], want[:-2])
    assert list(got[:7]) == [0x3F80, 0x3F82, 0x3F81, 0x7F7F, 0x7F80, 0x7F80, 0x7F80]
    assert got[-2] == 0x7FFF and got[-1] == 0xFFC0  # NaNs (top bits kept, quiet), signs kept


def test_shapes_and_other_dtypes():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, :, ::2]  # not contiguous, 3-D
    got = to_bf16(x)
    assert got.shape == x.shape and np.array_equal(got.astype(np.float32), x)
    assert to_bf16(np.float32([1.5, -2.25])).astype(np.float32).tolist() == [1.5, -2.25]
    d = np.array([[1 / 3]], np.float64)  # float64 goes through NumPy's conversion
    assert to_bf16(d).view(np.uint16) == np.array(d, dtype=BF16).view(np.uint16)
    assert to_bf16(np.zeros((0, 8), np.float32)).shape == (0, 8)
