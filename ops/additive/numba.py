"""Numba CPU kernel for causal linear attention: the recurrence, with the chunk's part in float32.

Token by token, with the current token included:

    S ← S + φ(k_t) v_tᵀ,  z ← z + φ(k_t),  y_t = φ(q_t)ᵀS / (φ(q_t)ᵀz + eps)

The carried state (S, z) stays in the state dtype (float64 by default) and is touched once per
chunk of C tokens: inside a chunk the kernel reads a compute-dtype copy S₀ of it and adds the
tokens to a compute-dtype delta ΔS that starts at zero, so y_t = φ(q_t)ᵀ(S₀ + ΔS_t); at the end of
the chunk ΔS is added to the carried S in the state dtype.  Rounding inside a chunk is therefore
relative to the chunk's own contribution, never to the (growing) state.  z is summed token by
token in float64 and the denominator formed in float64 (O(d_k) per token), so z keeps counting
past 2^24 tokens.  Any split of a sequence into calls gives the same result as one call, up to
the rounding of where the chunk boundaries fall.

What makes it fast (measured in tests/bench/test_bench_ops.py, see README):

- d_k and d_v are compile-time constants: `_causal_kernel(d_k, d_v, parallel)` compiles one
  kernel per head shape (cached in memory and on disk); inputs too small for `worth_threads`
  run on the calling thread;
- the heads are split into one contiguous group per thread, and each group walks its heads
  chunk by chunk: a chunk's rows of q, k and v are copied for all of the group's heads at once,
  in address order.  Walking one head through the whole sequence instead read 256 bytes out of
  every H·256 and left the hardware prefetchers behind: that cost as much as the arithmetic;
- the state is kept transposed, Sᵀ [d_v, d_k], so that the update of row e (ΔSᵀ[e] += v_e·φ(k))
  and its read (y_e = φ(q)·(S₀ᵀ[e] + ΔSᵀ[e])) run over contiguous memory, and four tokens share
  each pass over a row: ΔS and S₀ are loaded once per four tokens, with four independent sums
  in flight; the rows go in blocks of _ROW_BLOCK through all of a chunk's tokens, so that the
  block's rows stay in L1 (all of ΔS and S₀ is 32 KB at d=64);
- φ is applied to the chunk's copy with a float32 exp built from operations LLVM vectorizes
  (math.exp is a scalar libm call without SVML);
- the copies and small loops take their trip counts from the arrays' shapes: a loop with a small
  constant trip count is unrolled before the vectorizer sees it and then runs scalar;
- typed zeros everywhere in compute-dtype loops (a literal 0.0 would widen float32 to float64).

elu+1, relu and identity are compiled in; FAVOR+ (a map with parameters) is applied in NumPy first
and the kernel then runs with identity (the model's fused passes in model_kernels.py use the same
exp).  No BLAS is called, so nothing competes with the kernel's threads.  Kernels are compiled
with `cache=True` (on-disk cache next to this file, or NUMBA_CACHE_DIR), so workers of a Beam job
load them instead of compiling.
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import EluPlusOne, FeatureMap, Identity, Relu
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

__all__ = ["DEFAULT_CHUNK_SIZE", "numba_causal"]

# How many tokens' contributions are summed in the compute dtype before they are added to the
# carried state.  Measured with tests/bench/test_bench_ops.py (H=8, d=64, float32, README): for the
# first recurrent kernel 64 was the fastest, 32 about 20% slower, 128-256 within 10%; for this one
# the (saturated) run in README put 32-256 within ±20% of each other in no clear order.  Longer
# chunks also let float32 rounding in ΔS grow (relative to the chunk's own sum).
DEFAULT_CHUNK_SIZE = 64

_FMAP_IDENTITY, _FMAP_RELU, _FMAP_ELU1 = 0, 1, 2
# value rows of the state per block of the recurrence (see _head_chunk)
_ROW_BLOCK = 16


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _load_chunk(src, s, n, h0, h1, fmap, dst):  # pragma: no cover - compiled
    """dst[h - h0, :n] = φ(src[s:s+n, h]) for h in [h0, h1), in dst's dtype.

    The rows are read in address order (all of the group's heads of a token, then the next
    token), so the hardware prefetchers follow, and φ is applied on the way.  Trip counts
    come from the arrays' shapes, not from the compile-time widths: a loop with a small
    constant trip count is unrolled before the vectorizer sees it and then stays scalar."""
    m = src.shape[2]
    one = dst.dtype.type(1)
    zero = dst.dtype.type(0)
    if fmap == _FMAP_ELU1:
        for i in range(n):
            for h in range(h0, h1):
                for f in range(m):
                    x = src[s + i, h, f]
                    e = exp(zero if x > zero else x)
                    dst[h - h0, i, f] = x + one if x > zero else e
    elif fmap == _FMAP_RELU:
        for i in range(n):
            for h in range(h0, h1):
                for f in range(m):
                    x = src[s + i, h, f]
                    dst[h - h0, i, f] = x if x > zero else zero
    else:
        for i in range(n):
            for h in range(h0, h1):
                for f in range(m):
                    dst[h - h0, i, f] = src[s + i, h, f]


# inline="always": inlined in Numba's IR, so LLVM sees the buffers' compile-time row lengths
# (as a separate function the row addresses took so many registers that they spilled)
@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _head_chunk(qc, kc, vc, oc, n, st, zt, s0, ds, zc, inv, eps, dk, dv):  # pragma: no cover
    """One head over one chunk of n tokens: φ(q), φ(k) in qc, kc [C, dk], v in vc [C, dv];
    writes the numerators φ(q)ᵀS to oc [C, dv] and 1 / denominator to inv [C] (float64).
    st [dv, dk] (S transposed) and zt [dk] are the carried state in the state dtype,
    updated; s0, ds [dv, dk] (compute dtype) and zc [dk] (float64) are scratch, ds all zeros
    on entry and on return."""
    zero = qc.dtype.type(0)
    m = st.shape[1]
    for e in range(st.shape[0]):
        for f in range(m):
            s0[e, f] = st[e, f]
    # the denominators in float64, with z summed token by token in float64
    for f in range(m):
        zc[f] = zt[f]
    for i in range(n):
        den = 0.0
        for f in range(m):
            zc[f] += np.float64(kc[i, f])
            den += np.float64(qc[i, f]) * zc[f]
        inv[i] = 1.0 / (den + eps)
    for f in range(m):
        zt[f] = zc[f]
    # four tokens per pass over a row of ΔS: each row of ΔS and S₀ is loaded once for four
    # updates and four reads (the row of token i+1 is the row of token i plus its own term).
    # The rows go in blocks of _ROW_BLOCK, each through all of the chunk's tokens, so that
    # the block's ΔS and S₀ stay in L1 (all of both is 32 KB at d=64, L1's size here).
    for e0 in range(0, dv, _ROW_BLOCK):
        e1 = min(e0 + _ROW_BLOCK, dv)
        i = 0
        while i + 4 <= n:
            for e in range(e0, e1):
                v0 = vc[i, e]
                v1 = vc[i + 1, e]
                v2 = vc[i + 2, e]
                v3 = vc[i + 3, e]
                a0 = zero
                a1 = zero
                a2 = zero
                a3 = zero
                for f in range(dk):
                    sf = s0[e, f]
                    x = ds[e, f] + kc[i, f] * v0
                    a0 += qc[i, f] * (sf + x)
                    x = x + kc[i + 1, f] * v1
                    a1 += qc[i + 1, f] * (sf + x)
                    x = x + kc[i + 2, f] * v2
                    a2 += qc[i + 2, f] * (sf + x)
                    x = x + kc[i + 3, f] * v3
                    a3 += qc[i + 3, f] * (sf + x)
                    ds[e, f] = x
                oc[i, e] = a0
                oc[i + 1, e] = a1
                oc[i + 2, e] = a2
                oc[i + 3, e] = a3
            i += 4
        while i < n:  # the chunk's last n % 4 tokens
            for e in range(e0, e1):
                ve = vc[i, e]
                a = zero
                for f in range(dk):
                    x = ds[e, f] + kc[i, f] * ve
                    ds[e, f] = x
                    a += qc[i, f] * (s0[e, f] + x)
                oc[i, e] = a
            i += 1
    # fold the chunk into the carried state, in the state dtype
    for e in range(st.shape[0]):
        for f in range(m):
            st[e, f] += ds[e, f]
            ds[e, f] = zero


@functools.cache
def _causal_kernel(d_k: int, d_v: int, parallel: bool) -> Any:
    """The kernel for heads of width (d_k, d_v), both compile-time constants (one compile per
    shape and dtype combination, then from Numba's on-disk cache); head groups in parallel or
    not.

    The closure holds the two widths and nothing else: Numba keys a closure's cache entry by its
    pickled closure values, and a jitted function's pickled form differs from process to
    process, so a closure that held the helpers above was never found by the next process."""
    dk, dv = int(d_k), int(d_v)

    # error_model="numpy": a zero denominator (eps=0) gives inf/NaN as in NumPy, never an
    # exception, on both paths (parallel regions always behave so)
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def kernel(q, k, v, s_state, z_state, out, fmap, eps, chunk, ngroups):  # pragma: no cover
        """q, k [T, H, dk] and v [T, H, dv] in the compute dtype (C-contiguous); s_state
        [H, dk, dv] and z_state [H, dk] in the state dtype, updated in place; out [T, H, dv]
        (compute dtype) is written.  fmap: _FMAP_*; eps: float64; chunk: tokens per fold;
        ngroups: the heads are split into this many contiguous groups, one per parallel task,
        each walking its heads chunk by chunk."""
        t = q.shape[0]
        nh = q.shape[1]
        cdt = q.dtype
        sdt = s_state.dtype
        for g in prange(ngroups):
            h0 = g * nh // ngroups
            h1 = (g + 1) * nh // ngroups
            nl = h1 - h0
            st = np.empty((nl, dv, dk), sdt)  # the carried S, transposed (state dtype)
            zt = np.empty((nl, dk), sdt)
            s0 = np.empty((dv, dk), cdt)  # st in the compute dtype, for the current chunk
            ds = np.zeros((dv, dk), cdt)  # the chunk's tokens so far: Σ v φ(k)ᵀ
            zc = np.empty(dk, np.float64)
            inv = np.empty((nl, chunk), np.float64)  # 1 / denominator, per head and token
            qc = np.empty((nl, chunk, dk), cdt)  # φ(q), φ(k), v, out of the chunk, per head
            kc = np.empty((nl, chunk, dk), cdt)
            vc = np.empty((nl, chunk, dv), cdt)
            oc = np.empty((nl, chunk, dv), cdt)
            for hl in range(nl):
                for f in range(dk):
                    zt[hl, f] = z_state[h0 + hl, f]
                    for e in range(dv):
                        st[hl, e, f] = s_state[h0 + hl, f, e]
            for s in range(0, t, chunk):
                n = min(chunk, t - s)
                _load_chunk(q, s, n, h0, h1, fmap, qc)
                _load_chunk(k, s, n, h0, h1, fmap, kc)
                _load_chunk(v, s, n, h0, h1, _FMAP_IDENTITY, vc)
                for hl in range(nl):
                    _head_chunk(
                        qc[hl],
                        kc[hl],
                        vc[hl],
                        oc[hl],
                        n,
                        st[hl],
                        zt[hl],
                        s0,
                        ds,
                        zc,
                        inv[hl],
                        eps,
                        dk,
                        dv,
                    )
                # the numerators times 1 / denominator (float64), on the way out
                m = out.shape[2]
                for i in range(n):
                    for hl in range(nl):
                        r = inv[hl, i]
                        for e in range(m):
                            out[s + i, h0 + hl, e] = np.float64(oc[hl, i, e]) * r
            for hl in range(nl):
                for f in range(dk):
                    z_state[h0 + hl, f] = zt[hl, f]
                    for e in range(dv):
                        s_state[h0 + hl, f, e] = st[hl, e, f]

    return kernel


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
    """Causal linear attention on the CPU; inputs already checked by the caller.

    q, k [T, H, d_k]; v [T, H, d_v]; state S [H, F, d_v], z [H, F] (its dtype is the state
    dtype).  dtype: the compute dtype (float32 or float64).  chunk_size: how many tokens are
    summed in the compute dtype before they are added to the state.  Returns (out [T, H, d_v]
    in the compute dtype, the new state).  Neither the inputs nor `state` are modified.
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
    t, h, f = qx.shape
    dv = vx.shape[2]
    out = np.empty((t, h, dv), dtype=cdt)
    c = max(1, min(int(chunk_size), t))
    parallel = h > 1 and worth_threads(t * h * f * dv)
    groups = min(h, numba.get_num_threads()) if parallel else 1
    _causal_kernel(f, dv, parallel)(qx, kx, vx, s_new, z_new, out, code, float(eps), c, groups)
    return out, AttentionState(s_new, z_new)
