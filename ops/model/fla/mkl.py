"""MKL's matrix products, loaded with ctypes: from Intel's `mkl` package where it is installed
(`pip install linstream[mkl]`), else from the copy PyTorch's CPU library carries (torch itself
is not imported); each call at one MKL thread.

    sgemm_rows(x, w, out)        # out = x @ wᵀ: x [m, k], w [n, k] float32, out [m, n] float32
    bf16_rows(xb, wb, out)       # the same with bfloat16 x and w, accumulated in float32
    packed = PackedBF16(wb, ranges)   # wb's column ranges in MKL's packed form (`can_pack()`)
    packed.rows(xb, j, out)      # out[:, ranges[j]] = xb @ wb[ranges[j]]ᵀ
    library(), source()          # the loaded library (MKLUnavailable: one line saying why), and
                                 # which one it is, in words

x and w are C-contiguous (a range of a C-contiguous array's rows is); out's rows may be a
range of a wider array's columns (its rows are strided, its elements not).  Each call runs at
one thread (`MKL_Set_Num_Threads_Local`, restored after; Intel's package is loaded with its
sequential layer): the runtime's row or column ranges are its threads, so a product's bits do
not depend on the thread count.  Measured on one thread of a Xeon with AVX-512, at the ~110M
models' shapes: MKL's float32 product ran 1.25-1.3× NumPy's OpenBLAS at 64-128 rows and
1.02-1.04× at 2,048, with the same results to rounding; its results did not depend on the
operands' alignment (checked there at every 4-byte offset).

Packing (Intel's package only: PyTorch's copy does not export it): `cblas_gemm_bf16bf16f32`
reformats its whole weight at every call (there ~0.15 ms for a 768×2,304 weight, a 64-row
product's third), a packed weight is reformatted once.  Measured there, one thread: 64-row
products 1.6-1.8× the unpacked ones, 2,048-row ones 1.0-1.4×, the same bits as the unpacked
product of the same operands, whatever row count the weight was packed for.  MKL asks for a
buffer of 1.6-8× the weight's bytes and writes the weight's bytes of it (the rest, never
touched, is address space: each buffer is its own anonymous mapping, so untouched pages take
no memory).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import importlib.util
import mmap
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "MKLUnavailable",
    "PackedBF16",
    "bf16_rows",
    "can_pack",
    "library",
    "sgemm_rows",
    "source",
]

_ROW_MAJOR, _NO_TRANS, _TRANS, _PACKED, _B_MATRIX = 101, 111, 112, 151, 162  # CBLAS enums
_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
_T, _N = ctypes.c_char_p(b"T"), ctypes.c_char_p(b"N")
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)


class MKLUnavailable(RuntimeError):
    """MKL's products cannot run here (one line saying why)."""


def _package_library() -> str | None:
    """libmkl_rt of Intel's `mkl` package (pip's data files, beside the environment's lib)."""
    try:
        dist = importlib.metadata.distribution("mkl")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name.startswith("libmkl_rt.so"):
            return str(dist.locate_file(f))
    return None


def _torch_library() -> str | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    return os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cpu.so")


@functools.cache
def _loaded() -> tuple[ctypes.CDLL, str]:
    package, torch = _package_library(), _torch_library()
    path = package or torch
    if path is None:
        msg = "MKL's products need Intel's mkl package (pip install linstream[mkl]) or PyTorch"
        raise MKLUnavailable(msg)
    try:
        lib = ctypes.CDLL(path)
        sgemm, gemm, local = lib.SGEMM, lib.cblas_gemm_bf16bf16f32, lib.MKL_Set_Num_Threads_Local
    except (OSError, AttributeError) as ex:
        msg = f"{path} has no MKL products (SGEMM, cblas_gemm_bf16bf16f32): {ex}"
        raise MKLUnavailable(msg) from ex
    i, p, f, size = ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.c_size_t
    pi = ctypes.POINTER(ctypes.c_int)
    pf = ctypes.POINTER(ctypes.c_float)
    # Fortran SGEMM (column-major, every argument by reference)
    sgemm.argtypes = [ctypes.c_char_p, ctypes.c_char_p, pi, pi, pi, pf, p, pi, p, pi, pf, p, pi]
    sgemm.restype = None
    gemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    gemm.restype = None
    local.argtypes, local.restype = [i], i
    if package:
        lib.MKL_Set_Threading_Layer.argtypes = [i]
        lib.MKL_Set_Threading_Layer.restype = i
        lib.MKL_Set_Threading_Layer(_SEQUENTIAL)  # before any other call: no OpenMP runtime
    if hasattr(lib, "cblas_gemm_bf16bf16f32_pack"):
        lib.cblas_gemm_bf16bf16f32_pack_get_size.argtypes = [i, i, i, i]
        lib.cblas_gemm_bf16bf16f32_pack_get_size.restype = size
        lib.cblas_gemm_bf16bf16f32_pack.argtypes = [i, i, i, i, i, i, p, i, p]
        lib.cblas_gemm_bf16bf16f32_pack.restype = None
        lib.cblas_gemm_bf16bf16f32_compute.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
        lib.cblas_gemm_bf16bf16f32_compute.restype = None
    if package:
        name = f"Intel's mkl package {importlib.metadata.version('mkl')}"
    else:
        name = "PyTorch's CPU library"
    return lib, name


def library() -> ctypes.CDLL:
    """The MKL library: Intel's `mkl` package where installed, else PyTorch's CPU library."""
    return _loaded()[0]


def source() -> str:
    """Which library `library()` loaded, in words."""
    return _loaded()[1]


def can_pack() -> bool:
    """Whether the library packs bfloat16 weights (Intel's package does; PyTorch's copy not)."""
    return hasattr(library(), "cblas_gemm_bf16bf16f32_pack")


@contextlib.contextmanager
def _threads(lib: ctypes.CDLL, n: int) -> Iterator[None]:
    """MKL at n threads on this thread inside (its thread-local setting, restored after)."""
    prev = lib.MKL_Set_Num_Threads_Local(n)
    try:
        yield
    finally:
        lib.MKL_Set_Num_Threads_Local(prev)


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
    with _threads(lib, threads):
        # row-major out [m, n] = x wᵀ is column-major outᵀ [n, m] = w·xᵀ, w read transposed
        lib.SGEMM(_T, _N, cn, cm, ck, _ONE, w.ctypes.data, ck, x.ctypes.data, ck, _ZERO,
                  out.ctypes.data, cldc)  # fmt: skip


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
    with _threads(lib, 1):
        lib.cblas_gemm_bf16bf16f32(
            _ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, x.ctypes.data, k, w.ctypes.data, k,
            0.0, out.ctypes.data, out.strides[0] // 4,
        )  # fmt: skip


class PackedBF16:
    """A bfloat16 weight [n, k] in MKL's packed form, one buffer per column range (`ranges`:
    ranges of its n output columns, as the runtime's column ranges are), packed once; the
    weight itself is not kept."""

    __slots__ = ("_buffers", "k", "n", "ranges")

    def __init__(self, w: np.ndarray, ranges: Sequence[slice]) -> None:
        lib = library()
        if not can_pack():
            msg = f"{source()} cannot pack bfloat16 weights (Intel's mkl package can)"
            raise MKLUnavailable(msg)
        n, k = (int(d) for d in w.shape)
        if not (w.dtype.itemsize == 2 and w.flags.c_contiguous and w.ndim == 2):
            msg = f"MKL packing: expected a C-contiguous bfloat16 [n, k], got {w.dtype}{w.shape}"
            raise ValueError(msg)
        self.n, self.k, self.ranges = n, k, tuple(ranges)
        buffers = []
        for c in self.ranges:
            part = w[c]
            rows = int(part.shape[0])
            size = int(lib.cblas_gemm_bf16bf16f32_pack_get_size(_B_MATRIX, 64, rows, k))
            # its own anonymous mapping: the pages MKL never writes are never taken
            buf = np.frombuffer(mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE), np.uint8)
            if rows and k:
                lib.cblas_gemm_bf16bf16f32_pack(
                    _ROW_MAJOR, _B_MATRIX, _TRANS, 64, rows, k, part.ctypes.data, k,
                    buf.ctypes.data,
                )  # fmt: skip
            buffers.append(buf)
        self._buffers = tuple(buffers)

    @property
    def nbytes(self) -> int:
        """The weight's bytes (what the packed form takes of its buffers)."""
        return 2 * self.n * self.k

    def arrays(self) -> list[np.ndarray]:
        """Each buffer's first bytes, as many as its part of the weight takes: what the
        packed weight holds (for the model's held bytes)."""
        return [
            b[: 2 * (c.stop - c.start) * self.k]
            for b, c in zip(self._buffers, self.ranges, strict=True)
        ]

    def rows(self, x: np.ndarray, j: int, out: np.ndarray) -> None:
        """out[:, ranges[j]] = x @ w[ranges[j]]ᵀ for bfloat16 x [m, k] (C-contiguous) and a
        float32 out [m, n] with unit column stride, at one MKL thread."""
        c = self.ranges[j]
        m, k = x.shape
        cols = c.stop - c.start
        ok = (
            x.dtype.itemsize == 2 and x.dtype != np.float16 and x.flags.c_contiguous
            and k == self.k and out.dtype == np.float32 and out.shape == (m, self.n)
            and out.strides[1] == 4 and out.strides[0] % 4 == 0
        )  # fmt: skip
        if not ok:
            msg = (
                f"MKL packed product: expected a C-contiguous bfloat16 x [m, {self.k}] and a "
                f"float32 out [m, {self.n}] with unit column stride, got x {x.dtype}{x.shape}, "
                f"out {out.dtype}{out.shape} strides {out.strides}"
            )
            raise ValueError(msg)
        if m == 0 or cols == 0:
            return
        if k == 0:
            out[:, c] = 0.0
            return
        lib = library()
        with _threads(lib, 1):
            lib.cblas_gemm_bf16bf16f32_compute(
                _ROW_MAJOR, _NO_TRANS, _PACKED, m, cols, k, 1.0, x.ctypes.data, k,
                self._buffers[j].ctypes.data, k, 0.0, out[:, c].ctypes.data, out.strides[0] // 4,
            )  # fmt: skip
