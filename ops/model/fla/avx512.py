"""The matrix products on AVX-512 with each weight packed once at load, as Numba kernels:
bfloat16 inputs with float32 accumulation on AVX512-BF16 (VDPBF16PS), and float32 on AVX-512F
(VFMADD), float32 output.

    if reason_unavailable(dtype) is None:      # the CPU and Numba's LLVM have the instructions
        packed = Packed(w, ranges)             # w [n, k] bfloat16 or float32, per column range
        packed.rows(x, j, out)                 # out[:, ranges[j]] = x @ w[ranges[j]]ᵀ

x is [m, k] in the weight's dtype (the bfloat16 mode's engine rounds its float32 input once,
`bf16_round`), out float32 [m, n] with unit column stride.  VDPBF16PS multiplies two pairs of
bfloat16 values exactly (a product of two 8-bit significands fits a float32's 24) and adds them
to a float32 lane, rounding to nearest even; inputs and results below float32's normal range
count as zero (its DAZ and FTZ, in Intel's manual).  VFMADD rounds each x_j·w_j + s once.
Either way each output is a float32 sum in an order fixed by k alone (pair after pair, or term
after term), the same for every row and column, whoever runs which rows: the bits do not depend
on the ranges or the threads.

The layout: a column range's weight is cut into panels of NR = 48 columns (the last one of its
columns rounded up to 16, padded with zeros) and each panel stored as [k/2, 48] pairs (bfloat16)
or [k, 48] values (float32), so that one step of the dot product reads 48 columns as three
512-bit vectors; an input row's pair (or value) is one 32-bit value, broadcast. The tile
(`avx512_tiles`) keeps 8 × 3 = 24 accumulators in registers over the whole k (8 rows by 48
columns; a block's last rows in tiles of 4, 2 and 1, a range's last panel in 1 or 2 vectors: the
padding is under 16 columns a range), reads the panel from L2 and the rows from L1, and stores
once. The rows go in blocks of `avx512_tiles.ROW_BLOCK` (their input stays in L2 while every
panel passes). Measured on one core of a Zen 4 EPYC (AVX512-BF16, no AMX), the ~110M models'
shapes at 1,024 and 64 rows (tests/bench/test_bench_avx512.py): the bfloat16 tile 205-218
GFLOP/s, the float32 tile 108-112, where NumPy's float32 BLAS ran at 100-103 at 1,024 rows and
69-73 at 64 (a BLAS copies the weight into its layout at every call; these weights are packed
once), MKL's packed bfloat16 product at 62-93 and PyTorch's bfloat16 matmul (oneDNN, a bfloat16
output) at 176-212.

The tile is LLVM IR written in `avx512_tiles` (`numba.extending.intrinsic`: the x86 intrinsic
llvm.x86.avx512bf16.dpbf16ps.512, declared on 32-bit integer vectors, or llvm.fma.v16f32),
compiled by Numba for the host CPU; `reason_unavailable` says why it cannot run where the CPU or
the LLVM lacks the instructions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import ml_dtypes
import numpy as np

__all__ = ["NR", "Packed", "reason_unavailable"]

BF16 = np.dtype(ml_dtypes.bfloat16)
VECTORS = 3  # 512-bit vectors of 16 float32 columns in a tile
NR = 16 * VECTORS  # columns of a tile (of a panel)

_FEATURES = {"bfloat16": ("avx512bf16", "AVX512-BF16"), "float32": ("avx512f", "AVX-512")}


@functools.cache
def reason_unavailable(dtype: str = "bfloat16") -> str | None:
    """None where the kernel of `dtype` ("bfloat16" or "float32") can run here (the CPU's
    features, as Numba's LLVM reads them, include its instructions); else why not, in one line."""
    feature, name = _FEATURES[dtype]
    try:
        import llvmlite.binding as llvm
    except ImportError as ex:  # the device path runs without Numba
        return f"Numba is not installed ({ex})"

    try:
        features = llvm.get_host_cpu_features()
    except RuntimeError as ex:  # no host feature list from LLVM
        return f"Numba's LLVM cannot list this CPU's features ({ex})"
    if not features.get(feature, False):
        return f"this CPU has no {name} instructions (as Numba's LLVM reads its features)"
    return None


def _panels(w: np.ndarray) -> np.ndarray:
    """w [n, k] as panels of NR columns, each [steps, NR] (steps by columns: bfloat16 pairs as
    uint32, or float32 values), the last one [steps, its columns rounded up to 16], one after
    another in one flat array (a bfloat16 k and the last columns padded with zeros).  Each panel
    is copied straight from w (a padded copy of w first only where n is not a multiple of 16 or
    a bfloat16 k is odd): a load holds the panels and the mapped weight, nothing more."""
    n, k = w.shape
    bf16 = w.dtype == BF16
    steps = -(-k // 2) if bf16 else k
    wide = -(-n // 16) * 16
    if wide != n or (bf16 and k % 2):
        padded = np.zeros((wide, 2 * steps if bf16 else k), w.dtype)
        padded[:n, :k] = w
        w = padded
    v = np.ascontiguousarray(w).view(np.uint16).view(np.uint32) if bf16 else w  # [wide, steps]
    out = np.empty(wide * steps, np.uint32 if bf16 else np.float32)
    for c0 in range(0, wide, NR):
        c1 = min(c0 + NR, wide)
        out[c0 * steps : c1 * steps].reshape(steps, c1 - c0)[...] = v[c0:c1].T
    return out


class Packed:
    """A bfloat16 or float32 weight [n, k] as this kernel's panels, one set per column range
    (`ranges`, as `mkl.Packed`'s), packed once; the weight itself is not kept."""

    __slots__ = ("_panels", "dtype", "k", "n", "ranges")

    def __init__(self, w: np.ndarray, ranges: Sequence[slice]) -> None:
        if w.dtype not in (BF16, np.float32) or w.ndim != 2:
            msg = (
                "AVX-512 packing: expected a bfloat16 or float32 [n, k] weight, "
                f"got {w.dtype}{w.shape}"
            )
            raise ValueError(msg)
        self.n, self.k = (int(s) for s in w.shape)
        self.dtype, self.ranges = w.dtype, tuple(ranges)
        self._panels = tuple(_panels(np.asarray(w[c])) for c in self.ranges)

    @property
    def nbytes(self) -> int:
        """The weight's bytes (its panels hold them, plus the last panel's padding)."""
        return self.dtype.itemsize * self.n * self.k

    def arrays(self) -> list[np.ndarray]:
        """The panels (for the model's held bytes)."""
        return list(self._panels)

    def rows(self, x: np.ndarray, j: int, out: np.ndarray) -> None:
        """out[:, ranges[j]] = x @ w[ranges[j]]ᵀ for x [m, k] in the weight's dtype and a
        float32 out [m, n] with unit column stride."""
        m, k = x.shape
        name = "bfloat16" if self.dtype == BF16 else "float32"
        if x.dtype != self.dtype or k != self.k or out.shape != (m, self.n):
            msg = (
                f"AVX-512 product: expected x {name} [m, {self.k}] and out [m, {self.n}], "
                f"got x {x.dtype}{x.shape} and out {out.shape}"
            )
            raise ValueError(msg)
        if out.dtype != np.float32 or out.strides[1] != 4:
            msg = f"AVX-512 product: out must be float32, unit column stride, got {out.dtype}"
            raise ValueError(msg)
        c = self.ranges[j]
        cols = c.stop - c.start
        if m == 0 or cols == 0:
            return
        if k == 0:
            out[:, c] = 0.0
            return
        bf16 = self.dtype == BF16
        if (bf16 and k % 2) or not x.flags.c_contiguous:  # rows of whole pairs, 4-byte aligned
            padded = np.zeros((m, k + (k % 2 if bf16 else 0)), self.dtype)
            padded[:, :k] = x
            x = padded
        a = x.view(np.uint16).view(np.uint32) if bf16 else x
        from .avx512_tiles import product  # Numba, on the host only

        product(a, self._panels[j], out, c.start, cols, NR)
