"""Numba CPU kernel for causal linear attention, chunkwise form with a carried state.

One head per `prange` iteration.  For each chunk of C tokens of one head (Q̃ = φ(Q), K̃ = φ(K),
A = tril(Q̃K̃ᵀ), diagonal included):

    numerator = Q̃S + AV,  denominator = Q̃z + A1,  y = numerator / (denominator + eps)
    S ← S + K̃ᵀV,         z ← z + K̃ᵀ1

φ is applied while the chunk is gathered into contiguous buffers (elu+1, relu, identity are
compiled in; FAVOR+ is applied in NumPy first and the kernel then runs with identity).  Chunk math
runs in the compute dtype (float32 or float64); the chunk's contribution K̃ᵀV is added to the
carried state in the state dtype (float64 by default), and a compute-dtype copy of the state is
read by the next chunk.  Denominators and the final ratio are formed in float64 (O(C·d) per
token) so float32 chunk math stays within ~1.5e-7 of the float64 result.  float32 uses a
polynomial exp that LLVM vectorizes (math.exp is a scalar libm call without SVML and would cost
more than the state update).

Two kernels, one computation: `_causal_chunked` sends the four products per chunk to BLAS
(np.dot; SciPy's OpenBLAS, held to one thread during the call so it does not fight the per-head
threads), `_causal_loops` writes them as loops and serves short chunks and narrow heads.

Kernels are compiled with `cache=True` (on-disk cache next to this file, or NUMBA_CACHE_DIR), so
workers of a Beam job load them instead of compiling.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import math
import os
from collections.abc import Iterator
from typing import Any

# Numba's OpenMP threading layer spin-waits after each parallel region by default; between two
# kernel calls that spinning takes the cores from NumPy's BLAS threads (the model's projections)
# and made the model runtime 3-6x slower than with the NumPy backend.  Passive waiting must be
# set before libgomp starts (at the first parallel kernel, not at import); a user's setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import llvmlite.ir as llvmir
import numba
import numpy as np
from numba import prange
from numba.core import cgutils
from numba.core import types as nbtypes
from numba.extending import intrinsic, overload

from .attention_state import AttentionState
from .feature_maps import EluPlusOne, FeatureMap, Identity, Relu

__all__ = ["DEFAULT_CHUNK_SIZE", "numba_causal"]

# Measured with tests/bench/test_bench_ops.py (H=8, d=64, float32; tests/bench/RESULTS-ops.md):
# 32-64 are within noise of each other, 16 and 128 are slower; 64 also keeps the BLAS kernel
# for heads of width >= 16.
DEFAULT_CHUNK_SIZE = 64

# The loop kernel beats four BLAS calls per chunk for short chunks, and for narrow heads
# (d_k or d_v below 16) unless the chunk is long (its C² part is then better in BLAS).
_BLAS_MIN_DIM = 16
_BLAS_MIN_CHUNK = 8
_LOOPS_MAX_CHUNK = 64

_FMAP_IDENTITY, _FMAP_RELU, _FMAP_ELU1 = 0, 1, 2
# no nnan/ninf: NaN and Inf in the inputs must propagate to the outputs
_FASTMATH: set[str] = {"nsz", "arcp", "contract", "afn", "reassoc"}


@intrinsic
def _floor_f32(typingctx: Any, x: Any) -> Any:
    """floor of a float32 as a float32 (llvm.floor: one vroundps per vector, unlike math.floor,
    which returns an int64 that AVX2 cannot convert to in vectors)."""
    if x != nbtypes.float32:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fnty = llvmir.FunctionType(llvmir.FloatType(), [llvmir.FloatType()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.floor.f32")
        return builder.call(fn, [args[0]])

    return nbtypes.float32(x), codegen


@intrinsic
def _pow2_f32(typingctx: Any, n: Any) -> Any:
    """2**n as a float32 for an integer-valued float32 n in [-126, 128] (128 gives inf).

    Built in 32-bit integers (fptosi, add, shift, bitcast), which vectorize; Numba's own integer
    arithmetic would widen to int64, which AVX2 cannot convert to or from floats in vectors.
    """
    if n != nbtypes.float32:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i32 = llvmir.IntType(32)
        i = builder.fptosi(args[0], i32)
        i = builder.add(i, llvmir.Constant(i32, 127))
        i = builder.shl(i, llvmir.Constant(i32, 23))
        return builder.bitcast(i, llvmir.FloatType())

    return nbtypes.float32(n), codegen


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _exp_f32(x: Any) -> Any:
    """exp for float32 x (Cephes expf: Cody-Waite reduction + degree-6 polynomial, ~1 ulp).

    Built from vectorizable operations only; x is clamped to [-87.3, 88.7] (exp(-87.3) is the
    smallest normal float32, so the result there is 1.2e-38 instead of a subnormal or 0).
    """
    lo = np.float32(-87.3)
    hi = np.float32(88.7)
    x = lo if x < lo else x  # selects, not min/max: numba's min/max branch on NaN
    x = hi if x > hi else x
    # typingctx is implicit in an intrinsic's call (mypy sees the Python signature)
    n: Any = _floor_f32(  # type: ignore[call-arg]
        x * np.float32(1.44269504088896341) + np.float32(0.5)
    )
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * (r * r) + r + np.float32(1.0)
    scale: Any = _pow2_f32(n)
    return p * scale


def _exp(x: float) -> float:
    """exp in x's own precision: the vectorizable polynomial for float32, libm for float64."""
    return math.exp(x)


@overload(_exp, jit_options={"nogil": True, "fastmath": _FASTMATH})
def _exp_overload(x):  # unannotated: numba compares its signature with the lambdas'
    if x == nbtypes.float32:
        return lambda x: _exp_f32(x)
    return lambda x: math.exp(x)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _gather_mapped(src: Any, s: int, n: int, h: int, fmap: int, dst: Any, d: int) -> None:
    """dst[:n, :d] = φ(src[s:s+n, h, :d]) in dst's dtype (one fused, vectorizable pass per row)."""
    one = dst.dtype.type(1)
    zero = dst.dtype.type(0)
    if fmap == _FMAP_ELU1:
        for i in range(n):
            for f in range(d):
                x = dst.dtype.type(src[s + i, h, f])
                e = _exp(zero if x > zero else x)
                dst[i, f] = x + one if x > zero else e
    elif fmap == _FMAP_RELU:
        for i in range(n):
            for f in range(d):
                x = dst.dtype.type(src[s + i, h, f])
                dst[i, f] = x if x > zero else zero
    else:
        for i in range(n):
            for f in range(d):
                dst[i, f] = src[s + i, h, f]


@numba.njit(parallel=True, nogil=True, cache=True, fastmath=_FASTMATH)
def _causal_chunked(q, k, v, s_state, z_state, out, fmap, eps, chunk):
    """One call over a whole input; heads run in parallel.

    q, k [T, H, d_k] and v [T, H, d_v] in the compute dtype (C-contiguous); s_state [H, F, d_v]
    and z_state [H, F] in the state dtype, updated in place; out [T, H, d_v] is written.
    The four products per chunk go to BLAS through np.dot (single-threaded at these sizes);
    a last partial chunk is zero-padded, which adds nothing to the state.
    """
    t, nh, d = q.shape
    dv = v.shape[2]
    cdt = q.dtype
    zero = cdt.type(0)
    for h in prange(nh):
        qc = np.zeros((chunk, d), cdt)  # φ(Q) of the chunk
        kc = np.zeros((chunk, d), cdt)  # φ(K) of the chunk
        vc = np.zeros((chunk, dv), cdt)
        sc = np.empty((d, dv), cdt)  # compute-dtype copy of the carried S
        zc = np.empty(d, cdt)
        amat = np.empty((chunk, chunk), cdt)  # tril(φ(Q)φ(K)ᵀ)
        num = np.empty((chunk, dv), cdt)
        num2 = np.empty((chunk, dv), cdt)
        ds = np.empty((d, dv), cdt)  # the chunk's K̃ᵀV
        for f in range(d):
            zc[f] = z_state[h, f]
            for e in range(dv):
                sc[f, e] = s_state[h, f, e]
        for s in range(0, t, chunk):
            n = min(chunk, t - s)
            _gather_mapped(q, s, n, h, fmap, qc, d)
            _gather_mapped(k, s, n, h, fmap, kc, d)
            for i in range(n):
                for e in range(dv):
                    vc[i, e] = v[s + i, h, e]
            for i in range(n, chunk):
                for f in range(d):
                    qc[i, f] = zero
                    kc[i, f] = zero
                for e in range(dv):
                    vc[i, e] = zero
            np.dot(qc, sc, num)  # Q̃S
            np.dot(qc, kc.T, amat)  # Q̃K̃ᵀ
            for i in range(chunk):
                for j in range(i + 1, chunk):
                    amat[i, j] = zero
            np.dot(amat, vc, num2)  # AV
            for i in range(n):
                # the denominator and the final ratio in float64: O(C·d) per token, and it keeps
                # float32 chunk math within ~3e-7 of the float64 result (see test_precision_long)
                den = 0.0
                for f in range(d):
                    den += np.float64(qc[i, f] * zc[f])
                for j in range(i + 1):
                    den += np.float64(amat[i, j])
                inv = 1.0 / (den + eps)
                for e in range(dv):
                    out[s + i, h, e] = (np.float64(num[i, e]) + np.float64(num2[i, e])) * inv
            np.dot(kc.T, vc, ds)  # K̃ᵀV, added to the state in the state dtype
            for f in range(d):
                dz = zero
                for j in range(n):
                    dz += kc[j, f]
                z_state[h, f] += dz
                zc[f] = z_state[h, f]
                for e in range(dv):
                    s_state[h, f, e] += ds[f, e]
                    sc[f, e] = s_state[h, f, e]


@numba.njit(parallel=True, nogil=True, cache=True, fastmath=_FASTMATH)
def _causal_loops(q, k, v, s_state, z_state, out, fmap, eps, chunk):
    """The same computation as `_causal_chunked` in plain loops, for small heads or chunks
    (d_k or d_v below 16, C below 8), where BLAS call overhead would dominate."""
    t, nh, d = q.shape
    dv = v.shape[2]
    cdt = q.dtype
    zero = cdt.type(0)
    for h in prange(nh):
        qc = np.empty((chunk, d), cdt)
        kc = np.empty((chunk, d), cdt)
        vc = np.empty((chunk, dv), cdt)
        sc = np.empty((d, dv), cdt)
        zc = np.empty(d, cdt)
        ds = np.empty((d, dv), cdt)
        row = np.empty(dv, np.float64)  # accumulated in float64, like the BLAS kernel's ratio
        for f in range(d):
            zc[f] = z_state[h, f]
            for e in range(dv):
                sc[f, e] = s_state[h, f, e]
        for s in range(0, t, chunk):
            n = min(chunk, t - s)
            _gather_mapped(q, s, n, h, fmap, qc, d)
            _gather_mapped(k, s, n, h, fmap, kc, d)
            for i in range(n):
                for e in range(dv):
                    vc[i, e] = v[s + i, h, e]
            for i in range(n):
                den = 0.0
                for f in range(d):
                    den += np.float64(qc[i, f] * zc[f])
                for e in range(dv):
                    row[e] = 0.0
                for f in range(d):
                    a = qc[i, f]
                    for e in range(dv):
                        row[e] += np.float64(a * sc[f, e])
                for j in range(i + 1):
                    a = zero
                    for f in range(d):
                        a += qc[i, f] * kc[j, f]
                    den += np.float64(a)
                    for e in range(dv):
                        row[e] += np.float64(a * vc[j, e])
                inv = 1.0 / (den + eps)
                for e in range(dv):
                    out[s + i, h, e] = row[e] * inv
            for f in range(d):
                dz = zero
                for j in range(n):
                    dz += kc[j, f]
                z_state[h, f] += dz
                zc[f] = z_state[h, f]
                for e in range(dv):
                    ds[f, e] = zero
                for j in range(n):
                    a = kc[j, f]
                    for e in range(dv):
                        ds[f, e] += a * vc[j, e]
                for e in range(dv):
                    s_state[h, f, e] += ds[f, e]
                    sc[f, e] = s_state[h, f, e]


@functools.cache
def _blas_thread_controls() -> tuple[Any, Any] | None:
    """(get, set) for the thread count of the BLAS that Numba's np.dot calls (SciPy's OpenBLAS).

    Its own threads would compete with the kernel's per-head threads (and collapse throughput
    by 10-100× once a product is large enough for OpenBLAS to go parallel).  None when the
    library is not a recognizable OpenBLAS (then nothing is changed).
    """
    try:
        import scipy

        libs = glob.glob(os.path.join(os.path.dirname(scipy.__file__), "..", "scipy.libs", "*"))
        for path in sorted(libs):
            if "openblas" not in os.path.basename(path):
                continue
            lib = ctypes.CDLL(path)
            for prefix in ("scipy_openblas", "openblas"):
                get = getattr(lib, f"{prefix}_get_num_threads", None)
                set_ = getattr(lib, f"{prefix}_set_num_threads", None)
                if get is not None and set_ is not None:
                    get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                    return get, set_
    except (ImportError, OSError):  # no SciPy wheel layout: leave the BLAS alone
        pass
    return None


@contextlib.contextmanager
def _single_threaded_blas() -> Iterator[None]:
    controls = _blas_thread_controls()
    if controls is None:
        yield
        return
    get, set_ = controls
    before = int(get())
    set_(1)
    try:
        yield
    finally:
        set_(before)


def _fmap_code(fm: FeatureMap) -> int:
    if isinstance(fm, EluPlusOne):
        return _FMAP_ELU1
    if isinstance(fm, Relu):
        return _FMAP_RELU
    if isinstance(fm, Identity):
        return _FMAP_IDENTITY
    return -1


def numba_causal(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState,
    *,
    feature_map: FeatureMap,
    eps: float,
    chunk_size: int,
    dtype: Any,
) -> tuple[np.ndarray, AttentionState]:
    """Chunkwise causal linear attention on the CPU; inputs already checked by the caller.

    q, k [T, H, d_k]; v [T, H, d_v]; state S [H, F, d_v], z [H, F] (its dtype is the state
    dtype).  dtype: the compute dtype (float32 or float64).  Returns (out [T, H, d_v] in the
    compute dtype, the new state).  Neither the inputs nor `state` are modified.
    """
    cdt = np.dtype(dtype)
    code = _fmap_code(feature_map)
    if code < 0:  # maps with parameters (FAVOR+) run in NumPy, then the kernel uses identity
        qx = np.ascontiguousarray(feature_map.query(np.asarray(q, dtype=cdt), xp=np), dtype=cdt)
        kx = np.ascontiguousarray(feature_map(np.asarray(k, dtype=cdt), xp=np), dtype=cdt)
        code = _FMAP_IDENTITY
    else:
        qx = np.ascontiguousarray(q, dtype=cdt)
        kx = np.ascontiguousarray(k, dtype=cdt)
    vx = np.ascontiguousarray(v, dtype=cdt)
    s_new = np.array(state.S, copy=True, order="C")
    z_new = np.array(state.z, copy=True, order="C")
    t, h, _ = qx.shape
    out = np.empty((t, h, vx.shape[2]), dtype=cdt)
    c = max(1, min(int(chunk_size), t))
    narrow = min(qx.shape[2], vx.shape[2]) < _BLAS_MIN_DIM
    small = c < _BLAS_MIN_CHUNK or (narrow and c <= _LOOPS_MAX_CHUNK)
    kernel = _causal_loops if small else _causal_chunked
    if small:
        kernel(qx, kx, vx, s_new, z_new, out, code, cdt.type(eps), c)
    else:
        with _single_threaded_blas():
            kernel(qx, kx, vx, s_new, z_new, out, code, cdt.type(eps), c)
    return out, AttentionState(s_new, z_new)
