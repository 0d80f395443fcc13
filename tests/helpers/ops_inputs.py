"""What the ops tests share: the backends that can run here, q/k/v inputs, per-token errors."""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops.backend import cupy_available

BACKENDS = [
    "numpy",
    "numba",
    pytest.param("cupy", marks=pytest.mark.skipif(not cupy_available(), reason="no CUDA device")),
]


def make_qkv(rng, t, h, dk, dv, feature_map="elu+1", dtype=np.float64, scale=1.0):
    """q, k [t, h, dk] and v [t, h, dv].  For the identity map q and k are positive so that
    denominators stay away from zero (identity scores can cancel; that is ill-conditioned,
    not a kernel property)."""
    q = rng.standard_normal((t, h, dk)) * scale
    k = rng.standard_normal((t, h, dk)) * scale
    v = rng.standard_normal((t, h, dv))
    if feature_map == "identity":
        q, k = np.abs(q) + 0.1, np.abs(k) + 0.1
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def token_error(out, ref):
    """Worst per-token relative error ‖o_t − ref_t‖ / max(‖ref_t‖, 1e-3) over tokens and heads.

    A pure elementwise rtol fails on correct float32 kernels: a few outputs are near zero.
    """
    out = np.asarray(out, dtype=np.float64)
    num = np.linalg.norm(out - ref, axis=-1)
    den = np.maximum(np.linalg.norm(ref, axis=-1), 1e-3)
    return float(np.max(num / den)) if num.size else 0.0


def rel_error(a, b):
    """‖a − b‖∞ / max(‖b‖∞, 1e-12): for states, whose entries are all of one magnitude."""
    a = np.asarray(a, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))
