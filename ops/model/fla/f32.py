"""The float32 products: MKL's SGEMM on an Intel CPU where MKL is found, linstream's AVX-512
kernel on another CPU with AVX-512, else NumPy's BLAS.

    f32 = choose_f32_products()            # by the CPU's vendor (LINSTREAM_F32_PRODUCTS wins)
    f32.name, f32.note                     # "mkl" / "avx512" / "numpy", and the load's line
    f32.rows(x, w, out)                    # out = x @ wᵀ for a range of rows (one BLAS call)
    f32.packs, f32.pack(w, ranges)         # a float32 weight packed once (`mkl.Packed`,
                                           # `avx512.Packed`)

The float32 mode's products (and the bfloat16 mode's where it widens its weights) run through
`rows`, one call per range of rows or columns (`dense`); where the products `pack`, the float32
mode's weights are packed at load instead (`dense.Dense`: MKL's SGEMM copied each weight into
its own layout at every call, a quarter of a float32 forward's time at 64-token chunks here)
and the loaded arrays let go.  LINSTREAM_F32_PRODUCTS=mkl-mapped keeps the weights as loaded
(a float32 file's pages stay mapped, shared by the processes that map it).  The widening
bfloat16 engine multiplies by `rows` (it widens per product and keeps no packed copy): its bits
are the float32 mode's where that mode does not pack, and within the dot products' rounding of
them where it does (a packed product blocks its sums otherwise, from k = 1,024 on).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import avx512, mkl

__all__ = ["F32_ENGINES", "F32_ENV", "Float32Products", "Rows", "blas_rows", "choose_f32_products"]

Rows = Callable[[np.ndarray, np.ndarray, np.ndarray], None]  # rows(x, w, out): out = x @ wᵀ


def blas_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    np.matmul(x, w.T, out=out)


def _mkl_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    if x.dtype == w.dtype == np.float32 and w.flags.c_contiguous:
        mkl.sgemm_rows(np.ascontiguousarray(x), w, out)
    else:  # not a float32 product (the float64 mode's are NumPy's anyway)
        np.matmul(x, w.T, out=out)


@dataclass(frozen=True)
class Float32Products:
    """How the float32 products are formed: `rows` (NumPy's BLAS or MKL's SGEMM, one call per
    range), whether the float32 weights are packed once at load (`packs`, `pack`), and the line
    a load logs."""

    name: str
    rows: Rows
    note: str
    packs: bool = False

    def pack(self, w: np.ndarray, ranges: list[slice]) -> mkl.Packed | avx512.Packed:
        """A float32 w [n, k] packed once, per range of its output columns."""
        if self.name == "avx512":
            return avx512.Packed(w, ranges)
        return mkl.Packed(w, ranges)


F32_ENV = "LINSTREAM_F32_PRODUCTS"
F32_ENGINES = ("auto", "avx512", "mkl", "mkl-mapped", "numpy")
_AVX512_NOTE = "float32 products by linstream's AVX-512 kernel, the weights packed once at load"


def _intel(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        return False


def choose_f32_products(
    override: str | None = None, cpuinfo: str = "/proc/cpuinfo"
) -> Float32Products:
    """MKL's SGEMM on an Intel CPU where MKL is found (`mkl`: at 64-128 rows it ran 1.25-1.3×
    NumPy's OpenBLAS there, 1.02-1.04× at 2,048), its weights packed once at load where the
    library packs (both MKLs do: 64-row products another 1.2-1.4×); on another CPU with
    AVX-512, linstream's kernel (`avx512`, its weights packed once at load: on a Zen 4 EPYC
    GLA and DeltaNet ~110M ran 1.09-1.14× NumPy's OpenBLAS at 2,048-token chunks and 1.4-1.8× at
    64); else NumPy's BLAS.  `override` (default: the LINSTREAM_F32_PRODUCTS variable) is one of
    auto, avx512, mkl, mkl-mapped (MKL on the weights as loaded), numpy (one that cannot run here:
    mkl.MKLUnavailable, one line).  MKL is not picked on other CPUs by default: it was measured
    on an Intel one only (on the Zen 4, MKL's SGEMM ran at 0.86-1.22× OpenBLAS and 0.76-0.90×
    this kernel, tests/bench/test_bench_avx512.py)."""
    want = (override if override is not None else os.environ.get(F32_ENV, "auto")).strip().lower()
    if want not in F32_ENGINES:
        msg = f"{F32_ENV}={want!r}: expected one of {', '.join(F32_ENGINES)}"
        raise mkl.MKLUnavailable(msg)
    numpy = Float32Products("numpy", blas_rows, "float32 products by NumPy's BLAS")
    if want == "avx512":
        why = avx512.reason_unavailable("float32")
        if why is not None:
            msg = f"{F32_ENV}=avx512: {why}"
            raise mkl.MKLUnavailable(msg)
        return Float32Products("avx512", blas_rows, f"{_AVX512_NOTE} ({F32_ENV}=avx512)", True)
    if want == "auto" and not _intel(cpuinfo) and avx512.reason_unavailable("float32") is None:
        return Float32Products("avx512", blas_rows, _AVX512_NOTE, True)
    if want == "numpy" or (want == "auto" and not _intel(cpuinfo)):
        return numpy
    try:
        mkl.library()
    except mkl.MKLUnavailable:
        if want != "auto":
            raise
        return numpy
    if want != "mkl-mapped" and mkl.can_pack(np.float32):
        note = f"float32 products by MKL's SGEMM, the weights packed once at load ({mkl.source()})"
        return Float32Products("mkl", _mkl_rows, note, packs=True)
    note = f"float32 products by MKL's SGEMM on the weights as loaded ({mkl.source()})"
    return Float32Products("mkl", _mkl_rows, note)
