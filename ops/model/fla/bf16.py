"""The bfloat16 mode's matrix products: weights held in 16 bits, products accumulated in float32,
on the CPU's bfloat16 instructions where it has them.

    engine = choose_engine()                 # by the CPU's flags (LINSTREAM_BF16_PRODUCTS wins)
    engine.name, engine.note                 # "mkl" / "widen", and the line a load logs
    xs = engine.prepare(x)                   # per input, on the calling thread
    engine.rows(xs[r], w, out[r])            # "mkl": out[r] = x[r] @ wᵀ for a range of rows r
    wide = widened(w)                        # "widen": w as float32, for the float32 products

Three engines, one contract (x [T, k] and out [T, n] float32, w `ml_dtypes.bfloat16` [n, k]
C-contiguous; the products of one input share its `prepare`d form):

- "avx512bf16": linstream's own kernel on the AVX512-BF16 instructions (`avx512`,
  compiled by Numba), each weight packed once at load into its layout (`avx512.Packed`,
  per column range, as MKL's), x rounded to bfloat16 once per input as for "mkl".  Measured on
  a Zen 4 EPYC (AVX512_BF16, no AMX), one core, a [1024 × 768] by [768 × 2304] product: 209
  GFLOP/s, where NumPy's float32 BLAS ran at 103 and MKL's packed bfloat16 product at 88
  (tests/bench/test_bench_avx512.py).  A short chunk's products on it go to the pool's
  threads, not to `packed_batch`'s spinning helpers (they call MKL).

- "mkl": MKL's `cblas_gemm_bf16bf16f32` (bfloat16 inputs, float32 accumulation and output),
  from Intel's `mkl` package, else the copy PyTorch's CPU library carries (`mkl`: loaded with
  ctypes, torch itself is not imported).  With Intel's package each weight is packed once, at
  load (`mkl.Packed`, per column range: the mapped weight is then released); PyTorch's copy
  cannot pack, and reformats the mapped weight at each product (LINSTREAM_BF16_PRODUCTS=
  mkl-mapped asks for that with either library: the weights stay the file's pages, which
  several processes on one machine share).  x is rounded to bfloat16 (to nearest even) once per
  input (`prepare`, `bf16_round.to_bf16`: one Numba pass), before the row ranges.  MKL runs its
  AVX512_BF16 and AMX-BF16 kernels where the CPU has them; on a CPU without them it widens the
  inputs itself (the same results, measured here at 0.4-0.8 of NumPy's float32 product).
- "widen": the weight is widened to float32 per product (exact: a bfloat16 is a float32 with the
  low 16 bits zero), into a scratch buffer of the calling thread, and multiplied by NumPy's
  float32 BLAS with x as it is: the float32 mode's products on the same weights, bit for bit
  where that mode keeps its weights unpacked (`f32`: where it packs them, within the dot
  products' rounding); memory halved, no speed gained (widening costs 1-3% of a 2,048-row
  product, 10-25% of a 64-row one here).

`choose_engine()` picks "avx512bf16" where `/proc/cpuinfo` lists avx512_bf16 but not amx_bf16
(and Numba's LLVM has the instructions: `avx512.reason_unavailable`), "mkl" where it lists
amx_bf16 and the library is found (else the kernel), else "widen" (its note says why);
LINSTREAM_BF16_PRODUCTS=avx512bf16|mkl|mkl-mapped|widen forces one (one that cannot run here:
BF16Unavailable, one line).  MKL is held at one thread
per call (`MKL_Set_Num_Threads_Local`), as the runtime holds BLAS: its products run in the
runtime's row ranges, so the bits do not depend on the thread count.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from . import avx512, mkl

__all__ = ["BF16", "BF16Unavailable", "Engine", "choose_engine", "native_bf16"]

BF16 = np.dtype(ml_dtypes.bfloat16)
ENV = "LINSTREAM_BF16_PRODUCTS"
ENGINES = ("auto", "avx512bf16", "mkl", "mkl-mapped", "widen")
_NATIVE_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names, the faster first


class BF16Unavailable(RuntimeError):
    """The bfloat16 mode's native products cannot run here (one line saying why)."""


def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU's bfloat16 matrix instructions ("amx_bf16" or "avx512_bf16", as /proc/cpuinfo
    names them), or None (none, or no /proc/cpuinfo to tell)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return next((n for n in _NATIVE_FLAGS if n in flags), None)
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Engine:
    """A bfloat16 product: `name`, `note` (the load's line), `prepare(x)`, `rows(x, w, out)`."""

    name: str
    note: str
    #: the weights are packed once, at load ("mkl" with Intel's package)
    packs: bool = False

    @property
    def rounds(self) -> bool:
        """Whether the products take their input rounded to bfloat16 (`prepare`): a pass that
        writes a product's input may write it so (`block.StandardBlock`'s MLP)."""
        return self.name != "widen"

    def prepare(self, x: np.ndarray) -> np.ndarray:
        """What a product multiplies: x rounded to bfloat16 (avx512bf16, mkl; an x already in
        bfloat16 as it is), or x itself (widen)."""
        if not self.rounds or x.dtype == BF16:
            return x
        from .bf16_round import to_bf16  # Numba, on the host only

        return to_bf16(x)

    def pack(self, w: np.ndarray, ranges: list[slice]) -> mkl.Packed | avx512.Packed:
        """w [n, k] packed once, per range of its output columns (an engine that `packs`)."""
        if self.name == "avx512bf16":
            return avx512.Packed(w, ranges)
        return mkl.Packed(w, ranges)

    def rows(self, x: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """out = x @ wᵀ for x [t, k] (`prepare`d; float32 is rounded here) and out [t, n]
        float32 (C-contiguous rows), on the weight as loaded ("avx512bf16" packs every weight at
        load, so its products never come here)."""
        if self.name == "mkl":
            _mkl_rows(x, b, out)
        else:
            np.matmul(x, b.T, out=out)


def choose_engine(override: str | None = None) -> Engine:
    """The engine for this CPU (see the module docstring); `override` (default: the
    LINSTREAM_BF16_PRODUCTS variable) is one of auto, mkl, mkl-mapped, widen."""
    want = (override if override is not None else os.environ.get(ENV, "auto")).strip().lower()
    if want not in ENGINES:
        msg = f"{ENV}={want!r}: expected one of {', '.join(ENGINES)}"
        raise BF16Unavailable(msg)
    native = native_bf16()
    if want == "widen":
        return Engine("widen", f"bfloat16 weights widened to float32 per product ({ENV}=widen)")
    if want == "avx512bf16":
        why = avx512.reason_unavailable()
        if why is not None:
            msg = f"{ENV}=avx512bf16: {why}"
            raise BF16Unavailable(msg)
        return Engine("avx512bf16", f"{_NATIVE_NOTE} ({ENV}=avx512bf16)", packs=True)
    if want in ("mkl", "mkl-mapped"):
        _mkl()  # BF16Unavailable if missing
        packs = want == "mkl" and mkl.can_pack()
        how = f"natively ({native})" if native else "without native instructions (MKL widens)"
        return Engine(
            "mkl", f"bfloat16 products by MKL, {how}, {_held(packs)} ({ENV}={want})", packs
        )
    if native is None:
        return Engine(
            "widen",
            "this CPU has no bfloat16 matrix instructions (AVX512_BF16 or AMX-BF16): the weights "
            "are held in bfloat16 (half the memory) and widened to float32 per product, at about "
            "the float32 mode's speed",
        )
    kernel = avx512.reason_unavailable() is None
    if native != "amx_bf16" and kernel:
        return Engine("avx512bf16", _NATIVE_NOTE, packs=True)
    try:
        _mkl()
    except BF16Unavailable as ex:
        if kernel:
            return Engine("avx512bf16", f"{ex}: {_NATIVE_NOTE}", packs=True)
        return Engine("widen", f"{ex}: the bfloat16 weights are widened to float32 per product")
    packs = mkl.can_pack()
    note = f"bfloat16 products with float32 accumulation by MKL ({native}), {_held(packs)}"
    return Engine("mkl", note, packs)


_NATIVE_NOTE = (
    "bfloat16 products with float32 accumulation by linstream's AVX512-BF16 kernel, the weights "
    "packed once at load"
)


def _held(packs: bool) -> str:
    if packs:
        return f"the weights packed once at load ({mkl.source()})"
    return f"the mapped weights reformatted at each product ({mkl.source()})"


# -- MKL -----------------------------------------------------------------------------------------
def _mkl() -> None:
    """MKL's library loaded (BF16Unavailable, one line, where it cannot be)."""
    try:
        mkl.library()
    except mkl.MKLUnavailable as ex:
        raise BF16Unavailable(str(ex)) from ex


def _mkl_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    xb = np.asarray(x, dtype=BF16, order="C")  # prepared (or rounded to nearest even here)
    mkl.bf16_rows(xb, w, out)


# -- widening ------------------------------------------------------------------------------------
_scratch = threading.local()


def widened(w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """w [n, k] widened to float32 into `out` (C-contiguous float32 [n, k]), or by default the
    calling thread's scratch buffer (valid until its next call on this thread)."""
    if out is None:
        buf = getattr(_scratch, "buf", None)
        if buf is None or buf.size < w.size:
            buf = _scratch.buf = np.empty(w.size, np.float32)
        out = buf[: w.size].reshape(w.shape)
    wide = out
    # a bfloat16's bits are a float32's top 16: one shift (measured here ~1.3x faster than
    # ml_dtypes' cast, the same values)
    np.left_shift(w.view(np.uint16), 16, out=wide.view(np.uint32), dtype=np.uint32)
    return wide
