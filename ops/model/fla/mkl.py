"""MKL's matrix products, from the copy PyTorch's CPU library carries: found and loaded with
ctypes (torch itself is not imported), each call at one MKL thread.

    sgemm_rows(x, w, out)        # out = x @ wᵀ: x [m, k], w [n, k] float32, out [m, n] float32
    bf16_rows(xb, wb, out)       # the same with bfloat16 x and w, accumulated in float32
    library()                    # the loaded library (MKLUnavailable: one line saying why)

x and w are C-contiguous (a range of a C-contiguous array's rows is); out's rows may be a
range of a wider array's columns (its rows are strided, its elements not).  Each call runs at
one thread (`MKL_Set_Num_Threads_Local`, restored after): the runtime's row or column ranges
are its threads, so a product's bits do not depend on the thread count.  Measured on one
thread of a Xeon with AVX-512, at the ~110M models' shapes: MKL's float32 product ran 1.25-1.3×
NumPy's OpenBLAS at 64-128 rows and 1.02-1.04× at 2,048, with the same results to rounding; its
results did not depend on the operands' alignment (checked there at every 4-byte offset).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from typing import Any

import numpy as np

__all__ = ["MKLUnavailable", "bf16_rows", "library", "sgemm_rows"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS enums
_T, _N = ctypes.c_char_p(b"T"), ctypes.c_char_p(b"N")
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)


class MKLUnavailable(RuntimeError):
    """MKL's products cannot run here (one line saying why)."""


@functools.cache
def library() -> ctypes.CDLL:
    """PyTorch's CPU library, with MKL's float32 and bfloat16 products and thread setter."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        msg = "MKL's products need PyTorch's CPU library (pip install torch)"
        raise MKLUnavailable(msg)
    path = os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path)
        sgemm, gemm, local = lib.SGEMM, lib.cblas_gemm_bf16bf16f32, lib.MKL_Set_Num_Threads_Local
    except (OSError, AttributeError) as ex:
        msg = f"{path} has no MKL products (SGEMM, cblas_gemm_bf16bf16f32): {ex}"
        raise MKLUnavailable(msg) from ex
    i, p, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    pi = ctypes.POINTER(ctypes.c_int)
    pf = ctypes.POINTER(ctypes.c_float)
    # Fortran SGEMM (column-major, every argument by reference)
    sgemm.argtypes = [ctypes.c_char_p, ctypes.c_char_p, pi, pi, pi, pf, p, pi, p, pi, pf, p, pi]
    sgemm.restype = None
    gemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    gemm.restype = None
    local.argtypes, local.restype = [i], i
    return lib


def _checked(x: np.ndarray, w: np.ndarray, out: np.ndarray, dtype: Any) -> tuple[int, int, int]:
    m, k = x.shape
    n = w.shape[0]
    ok = (
        x.dtype == w.dtype == dtype
        and out.dtype == np.float32
        and w.shape[1] == k
        and out.shape == (m, n)
        and x.flags.c_contiguous
        and w.flags.c_contiguous
        and out.strides[1] == 4
        and out.strides[0] % 4 == 0
    )
    if not ok:
        msg = (
            f"MKL product: expected C-contiguous {np.dtype(dtype)} x [m, k], w [n, k] and a "
            f"float32 out [m, n] with unit column stride, got x {x.dtype}{x.shape}, w "
            f"{w.dtype}{w.shape}, out {out.dtype}{out.shape} strides {out.strides}"
        )
        raise ValueError(msg)
    return m, k, n


def sgemm_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray, threads: int = 1) -> None:
    """out = x @ wᵀ in float32 by MKL (x [m, k], w [n, k], out [m, n]); threads: MKL's for
    this call (the runtime's are 1: its ranges are its threads)."""
    m, k, n = _checked(x, w, out, np.float32)
    if m == 0 or n == 0:
        return
    if k == 0:
        out[...] = 0.0
        return
    lib = library()
    ldc = out.strides[0] // 4
    cm, cn, ck, cldc = ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k), ctypes.c_int(ldc)
    prev = lib.MKL_Set_Num_Threads_Local(threads)
    try:
        # row-major out [m, n] = x wᵀ is column-major outᵀ [n, m] = w·xᵀ, w read transposed
        lib.SGEMM(_T, _N, cn, cm, ck, _ONE, w.ctypes.data, ck, x.ctypes.data, ck, _ZERO,
                  out.ctypes.data, cldc)  # fmt: skip
    finally:
        lib.MKL_Set_Num_Threads_Local(prev)


def bf16_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out = x @ wᵀ for bfloat16 x [m, k] and w [n, k], accumulated in float32 by MKL at one
    thread (its AVX512_BF16 / AMX-BF16 kernels where the CPU has them)."""
    m, k, n = _checked(x, w, out, w.dtype)
    if m == 0 or n == 0:
        return
    if k == 0:
        out[...] = 0.0
        return
    lib = library()
    prev = lib.MKL_Set_Num_Threads_Local(1)
    try:
        lib.cblas_gemm_bf16bf16f32(
            _ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, x.ctypes.data, k, w.ctypes.data, k,
            0.0, out.ctypes.data, out.strides[0] // 4,
        )  # fmt: skip
    finally:
        lib.MKL_Set_Num_Threads_Local(prev)
