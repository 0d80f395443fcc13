"""A simple recurrent Numba prototype of the additive kernel, carried as a benchmark contender.

    out = recurrent_prototype(q, k, v)      # q, k [T, H, d_k], v [T, H, d_v] float32 -> [T, H, d_v]
    recurrent_prototype_htd(qh, kh, vh, oh) # the same on head-major [H, T, d] arrays, into oh

elu+1, eps 1e-6, from a zero state.  One head per `prange` task, token by token, the state kept
transposed (Sᵀ [d_v, d_k]) in float32, d_k and d_v compile-time constants, φ with linstream's
vectorizable float32 exp.  It keeps no float64 state and no chunking: it is the speed a few
dozen lines reach, not a kernel with the precision guarantees of `linstream.ops` (a float32
state stops counting z near 2^24 tokens).  The head-major form reads each head's rows
contiguously; the benchmark gives it its inputs in that layout and does not time the change.
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np
from linstream.ops.numba_tools import FASTMATH, exp
from numba import prange


@functools.cache
def _kernel(d_k: int, d_v: int, head_major: bool) -> Any:
    dk, dv = int(d_k), int(d_v)

    @numba.njit(inline="always")
    def at(a, i, h, f):  # pragma: no cover - compiled
        return a[h, i, f] if head_major else a[i, h, f]

    @numba.njit(parallel=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(q, k, v, out, eps):  # pragma: no cover - compiled
        t = q.shape[1] if head_major else q.shape[0]
        nh = q.shape[0] if head_major else q.shape[1]
        one = np.float32(1)
        zero = np.float32(0)
        for h in prange(nh):
            st = np.zeros((dv, dk), np.float32)
            z = np.zeros(dk, np.float32)
            qf = np.empty(dk, np.float32)
            kf = np.empty(dk, np.float32)
            for i in range(t):
                for f in range(dk):
                    x = at(q, i, h, f)
                    qf[f] = x + one if x > zero else exp(x if x < zero else zero)
                    x = at(k, i, h, f)
                    kf[f] = x + one if x > zero else exp(x if x < zero else zero)
                den = zero
                for f in range(dk):
                    z[f] += kf[f]
                    den += qf[f] * z[f]
                inv = one / (den + eps)
                for e in range(dv):
                    ve = at(v, i, h, e)
                    acc = zero
                    for f in range(dk):
                        s = st[e, f] + kf[f] * ve
                        st[e, f] = s
                        acc += qf[f] * s
                    y = acc * inv
                    if head_major:
                        out[h, i, e] = y
                    else:
                        out[i, h, e] = y

    return run


def recurrent_prototype(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal linear attention (elu+1, eps 1e-6) from a zero state; out [T, H, d_v] float32."""
    out = np.empty(v.shape, np.float32)
    _kernel(q.shape[2], v.shape[2], False)(q, k, v, out, np.float32(1e-6))
    return out


def recurrent_prototype_htd(qh: Any, kh: Any, vh: Any, oh: Any) -> None:
    """The same on head-major float32 arrays qh, kh [H, T, d_k], vh [H, T, d_v], into oh."""
    _kernel(qh.shape[2], vh.shape[2], True)(qh, kh, vh, oh, np.float32(1e-6))
