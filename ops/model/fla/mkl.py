"""MKL's matrix products, loaded with ctypes: from Intel's `mkl` package where it is installed
(`pip install linstream[mkl]`), else from the copy PyTorch's CPU library carries (torch itself
is not imported); each call at one MKL thread.

    sgemm_rows(x, w, out)        # out = x @ wᵀ: x [m, k], w [n, k] float32, out [m, n] float32
    bf16_rows(xb, wb, out)       # the same with bfloat16 x and w, accumulated in float32
    packed = Packed(w, ranges)   # w's column ranges in MKL's packed form (bfloat16 or
                                 # float32 w: `can_pack(w.dtype)`)
    packed.rows(x, j, out)       # out[:, ranges[j]] = x @ w[ranges[j]]ᵀ
    packed.task(x, j, out)       # the same as the numbers of its MKL call (`packed_batch`
                                 # makes it from jitted code, at `compute_address(dtype)`)
    with one_thread(): ...       # MKL at one thread on this thread
    Cell(packed, x, j, out)      # packed.rows(x, j, out) as a call, and Group([calls]): calls
                                 # run in turn as one (`packed_batch` hands its helpers a group
                                 # of cells; another engine's group it declines)
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

Packing: an unpacked product reformats its whole weight at every call (there ~0.15 ms for a
768×2,304 bfloat16 weight, a 64-row product's third; MKL's float32 copies were a quarter of a
float32 forward's time at 64-token chunks), a packed weight is reformatted once.  bfloat16:
Intel's package only (PyTorch's copy does not export `cblas_gemm_bf16bf16f32_pack`); measured
there, one thread: 64-row products 1.6-1.8× the unpacked ones, 2,048-row ones 1.0-1.4×, the same
bits as the unpacked product of the same operands, whatever row count the weight was packed for.
float32 (`cblas_sgemm_pack`, both libraries): 64-row products 1.2-1.4× the unpacked ones,
2,048-row ones 1.0-1.07×; the same bits as SGEMM's for k below 1,024, not always above (another
blocking of the sum: within the dot product's rounding bound either way).  MKL asks for a buffer
of 1.6-8× the weight's bytes and writes the weight's bytes of it (the rest, never touched, is
address space: each buffer is its own anonymous mapping, so untouched pages take no memory).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import importlib.util
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "Cell",
    "Group",
    "MKLUnavailable",
    "Packed",
    "bf16_rows",
    "can_pack",
    "compute_address",
    "library",
    "one_thread",
    "sgemm_rows",
    "source",
]

_ROW_MAJOR, _NO_TRANS, _TRANS, _PACKED, _B_MATRIX = 101, 111, 112, 151, 162  # CBLAS enums
_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
_T, _N = ctypes.c_char_p(b"T"), ctypes.c_char_p(b"N")
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)
_I, _P, _F = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
#: a weight's dtype -> MKL's functions for it, each (name, argument types): the packed size,
#: the packing and the packed product (bfloat16: alpha at the product; float32: at the packing)
_PACKING = {
    "bfloat16": (
        ("cblas_gemm_bf16bf16f32_pack_get_size", [_I] * 4),
        ("cblas_gemm_bf16bf16f32_pack", [_I, _I, _I, _I, _I, _I, _P, _I, _P]),
        ("cblas_gemm_bf16bf16f32_compute", [_I] * 6 + [_F, _P, _I, _P, _I, _F, _P, _I]),
    ),
    "float32": (
        ("cblas_sgemm_pack_get_size", [_I] * 4),
        ("cblas_sgemm_pack", [_I] * 6 + [_F, _P, _I, _P]),
        ("cblas_sgemm_compute", [_I] * 6 + [_P, _I, _P, _I, _F, _P, _I]),
    ),
}


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
    i, p, f, size = _I, _P, _F, ctypes.c_size_t
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
    for functions in _PACKING.values():
        if hasattr(lib, functions[1][0]):
            for (fname, argtypes), restype in zip(functions, (size, None, None), strict=True):
                getattr(lib, fname).argtypes, getattr(lib, fname).restype = argtypes, restype
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


def _kind(dtype: Any) -> str | None:
    """ "bfloat16" or "float32" for a weight dtype MKL packs (or its name), else None."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return name if name in _PACKING else None


def can_pack(dtype: Any = "bfloat16") -> bool:
    """Whether the library packs weights of this dtype: bfloat16 (Intel's package does,
    PyTorch's copy not) or float32 (both do)."""
    kind = _kind(dtype)
    return kind is not None and hasattr(library(), _PACKING[kind][1][0])


def compute_address(dtype: Any) -> int:
    """The address of the library's packed product for weights of `dtype` (what `Packed.rows`
    calls: cblas_sgemm_compute, cblas_gemm_bf16bf16f32_compute), 0 where it has none."""
    kind = _kind(dtype)
    fn = getattr(library(), _PACKING[kind][2][0], None) if kind is not None else None
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0) if fn is not None else 0


def one_thread() -> contextlib.AbstractContextManager[None]:
    """MKL at one thread on this thread inside (as each of this module's products runs)."""
    return _threads(library(), 1)


@contextlib.contextmanager
def _threads(lib: ctypes.CDLL, n: int) -> Iterator[None]:
    """MKL at n threads on this thread inside (its thread-local setting, restored after)."""
    prev = lib.MKL_Set_Num_Threads_Local(n)
    try:
        yield
    finally:
        lib.MKL_Set_Num_Threads_Local(prev)


def _checked(x: np.ndarray, w: tuple[int, int], out: np.ndarray, dtype: Any) -> None:
    """One line unless x [m, k] is C-contiguous in `dtype`, the weight's shape w is [n, k] and
    out [m, n] float32 with unit column stride (its rows may be a wider array's columns)."""
    n, k = w
    ok = (
        x.dtype == dtype
        and x.ndim == 2
        and x.shape[1] == k
        and x.flags.c_contiguous
        and out.dtype == np.float32
        and out.shape == (x.shape[0], n)
        and out.strides[1] == 4
        and out.strides[0] % 4 == 0
    )
    if not ok:
        msg = (
            f"MKL product: expected a C-contiguous {np.dtype(dtype)} x [m, {k}] and a float32 "
            f"out [m, {n}] with unit column stride, got x {x.dtype}{x.shape}, out "
            f"{out.dtype}{out.shape} strides {out.strides}"
        )
        raise ValueError(msg)


def _weight(w: np.ndarray) -> tuple[int, int]:
    if not (w.ndim == 2 and w.flags.c_contiguous):
        msg = f"MKL product: expected a C-contiguous weight [n, k], got {w.dtype}{w.shape}"
        raise ValueError(msg)
    return int(w.shape[0]), int(w.shape[1])


def sgemm_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray, threads: int = 1) -> None:
    """out = x @ wᵀ in float32 by MKL (x [m, k], w [n, k], out [m, n]); threads: MKL's for
    this call (the runtime's are 1: its ranges are its threads)."""
    n, k = _weight(w)
    _checked(x, (n, k), out, np.float32)
    if w.dtype != np.float32:
        msg = f"MKL's SGEMM: expected a float32 weight, got {w.dtype}{w.shape}"
        raise ValueError(msg)
    m = x.shape[0]
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
    n, k = _weight(w)
    _checked(x, (n, k), out, w.dtype)
    m = x.shape[0]
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


#: the row count MKL is told a packed weight's products will have: 1,024 ran 64-row products
#: as fast as 64 did and 1,024-row ones 1.0-1.1× as fast (one thread, the ~110M models' shapes,
#: both dtypes), with the same bits
_HINT = 1024


def _buffer(size: int) -> np.ndarray:
    """A buffer of `size` bytes in its own anonymous private mapping: the pages MKL never
    writes are never taken.  (Transparent huge pages for the written part, as NumPy asks for its
    large arrays, made no difference to a packed product's speed here.)"""
    return np.frombuffer(mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE), np.uint8)


class Packed:
    """A weight [n, k] (bfloat16 or float32) in MKL's packed form, one buffer per column range
    (`ranges`: ranges of its n output columns, as the runtime's column ranges are), packed
    once; the weight itself is not kept."""

    __slots__ = ("_buffers", "_compute", "dtype", "k", "n", "ranges")

    def __init__(self, w: np.ndarray, ranges: Sequence[slice]) -> None:
        kind = _kind(w.dtype)
        if kind is None:
            msg = f"MKL packing: expected a bfloat16 or float32 weight, got {w.dtype}{w.shape}"
            raise ValueError(msg)
        if not can_pack(kind):
            msg = f"{source()} cannot pack {kind} weights (Intel's mkl package can)"
            raise MKLUnavailable(msg)
        lib = library()
        self.n, self.k = _weight(w)
        self.dtype, self.ranges = w.dtype, tuple(ranges)
        get_size, pack, compute = (getattr(lib, name) for name, _ in _PACKING[kind])
        self._compute = compute
        k = self.k
        alpha = (1.0,) if kind == "float32" else ()  # sgemm_pack scales by alpha as it packs
        buffers = []
        for c in self.ranges:
            part = w[c]
            rows = int(part.shape[0])
            size = int(get_size(_B_MATRIX, _HINT, rows, k))
            buf = _buffer(size)
            if rows and k:
                pack(_ROW_MAJOR, _B_MATRIX, _TRANS, _HINT, rows, k, *alpha, part.ctypes.data, k,
                     buf.ctypes.data)  # fmt: skip
            buffers.append(buf)
        self._buffers = tuple(buffers)

    @property
    def nbytes(self) -> int:
        """The weight's bytes (what the packed form takes of its buffers)."""
        return self.dtype.itemsize * self.n * self.k

    def arrays(self) -> list[np.ndarray]:
        """Each buffer's first bytes, as many as its part of the weight takes: what the
        packed weight holds (for the model's held bytes)."""
        size = self.dtype.itemsize * self.k
        return [
            b[: size * (c.stop - c.start)] for b, c in zip(self._buffers, self.ranges, strict=True)
        ]

    def task(self, x: np.ndarray, j: int, out: np.ndarray) -> tuple[int, ...] | None:
        """`rows(x, j, out)` as the numbers its MKL call takes, for a caller that makes the call
        itself (`packed_batch`): (float32: 0, bfloat16: 1; m, n, k, x's address, its row
        stride, the packed buffer's address, k, out's first element of the range, its row
        stride), after the same checks; None where `rows` makes no call (an empty product)."""
        _checked(x, (self.n, self.k), out, self.dtype)
        c = self.ranges[j]
        m, k = x.shape
        cols = c.stop - c.start
        if m == 0 or cols == 0 or k == 0:
            return None
        kind = 0 if self.dtype == np.float32 else 1
        start = out.ctypes.data + 4 * c.start
        buf = self._buffers[j].ctypes.data
        return (kind, m, cols, k, x.ctypes.data, k, buf, k, start, out.strides[0] // 4)

    def rows(self, x: np.ndarray, j: int, out: np.ndarray) -> None:
        """out[:, ranges[j]] = x @ w[ranges[j]]ᵀ for x [m, k] in the weight's dtype
        (C-contiguous) and a float32 out [m, n] with unit column stride, at one MKL thread."""
        _checked(x, (self.n, self.k), out, self.dtype)
        c = self.ranges[j]
        m, k = x.shape
        cols = c.stop - c.start
        if m == 0 or cols == 0:
            return
        if k == 0:
            out[:, c] = 0.0
            return
        ldc = out.strides[0] // 4
        args = (m, cols, k) if self.dtype == np.float32 else (m, cols, k, 1.0)
        with _threads(library(), 1):
            self._compute(
                _ROW_MAJOR, _NO_TRANS, _PACKED, *args, x.ctypes.data, k,
                self._buffers[j].ctypes.data, k, 0.0, out[:, c].ctypes.data, ldc,
            )  # fmt: skip


class Cell:
    """`packed.rows(x, j, out)` as a call (`packed_batch` makes its MKL call itself, from
    `packed.task`)."""

    __slots__ = ("j", "out", "packed", "x")

    def __init__(self, packed: Packed, x: np.ndarray, j: int, out: np.ndarray) -> None:
        self.packed, self.x, self.j, self.out = packed, x, j, out

    def __call__(self) -> None:
        self.packed.rows(self.x, self.j, self.out)


class Group:
    """Calls run one after another on one thread, as one call (a short chunk's part, whole):
    `Cell`s, which `packed_batch` can hand to its helpers, or any other engine's calls, which
    it declines."""

    __slots__ = ("cells",)

    def __init__(self, cells: Sequence[Callable[[], None]]) -> None:
        self.cells = list(cells)

    def __call__(self) -> None:
        for cell in self.cells:
            cell()
