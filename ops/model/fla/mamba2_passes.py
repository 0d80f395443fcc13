"""Fused Numba passes of Mamba-2's layer between its products, each one pass over a chunk where
NumPy takes several (float32 or float64, inputs of any strides: views of the in-projection).

    y, tail = conv_silu(xbc, tail, w, bias)     SiLU(bias + depthwise causal conv of width W)
    o = gated_norm(y, z, weight, groups, eps, mode)
                                                the gated RMSNorm over `groups` groups of a row

conv_silu: y_t[d] = SiLU(bias[d] + Σ_j w[d, j] · x_{t−W+1+j}[d]) over x [T, D], its first
outputs reading the last W−1 raw inputs of the chunk before (`tail` [W−1, D], zeros at a
sequence's start); returns y [T, D] in x's dtype and the new tail (the last W−1 raw inputs,
partly the old tail's for a chunk shorter than W−1) in tail's dtype.  It is the short
convolution of `pieces.short_conv` with a bias, the convolution of transformers' and fla's
Mamba-2 (`nn.Conv1d(groups=D, padding=W−1)` cut to T outputs, then the activation), and runs
the fla families' kernel (`fused.conv`).

gated_norm, with g = silu(z) = z · sigmoid(z) and RMS over each group of a row,
x / sqrt(mean(x²) + eps) · weight:

    mode "gate_then_norm"   RMS(y · g)          transformers' MambaRMSNormGated; fla's
                                                RMSNormGated with norm_before_gate False
    mode "norm_then_gate"   RMS(y) · g          fla's norm_before_gate True
    mode "gate"             y · g               fla's Mamba-2 with rmsnorm False (no weight)

sigmoid(x) = 1 / (1 + e^−x) with `numba_tools.exp`, as `fused.silu`.  Rows go to Numba's
threads from 2^18 elements on (`worth_threads`).  Strided inputs are copied to C order first
(one cheap pass): on a view of the in-projection the loops do not vectorize, and each pass ran
about twice as long as copy and pass together (2,048 × 1,792 on 2 threads).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linstream.ops.numba_tools import FASTMATH, exp, njit_variant, worth_threads
from numba import prange

from . import fused
from .mamba2_xp import GATED_NORM_MODES  # Numba-free, so the device path shares it

__all__ = ["GATED_NORM_MODES", "conv_silu", "gated_norm"]

_WORK_PER_ELEMENT = 16  # as fused.py: a parallel region from 2^18 elements


def _norm_kernel(parallel: bool) -> Any:
    @njit_variant(parallel, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def run(y, z, w, groups, eps, mode, out):  # pragma: no cover - compiled
        """y, z [T, D] (C-contiguous); w [D]; out [T, D]; mode an index of GATED_NORM_MODES.
        A row in simple loops (gate, each group's sum of squares, scale, gate), each one a
        vector loop: one loop doing all of it ran ~10x slower."""
        t, dd = y.shape
        gs = dd // groups
        one = out.dtype.type(1)
        for i in prange(t):
            if mode == 0:
                for d in range(dd):
                    v = z[i, d]
                    out[i, d] = y[i, d] * (v / (one + exp(-v)))
            else:
                for d in range(dd):
                    out[i, d] = y[i, d]
            if mode != 2:
                for g in range(groups):
                    row = out[i, g * gs : (g + 1) * gs]
                    wg = w[g * gs : (g + 1) * gs]
                    ss = 0.0
                    for d in range(gs):
                        ss += row[d] * row[d]
                    r = out.dtype.type(1.0 / np.sqrt(ss / gs + eps))
                    for d in range(gs):
                        row[d] = row[d] * r * wg[d]
            if mode != 0:
                for d in range(dd):
                    v = z[i, d]
                    out[i, d] = out[i, d] * (v / (one + exp(-v)))

    return run


_NORM = {p: _norm_kernel(p) for p in (False, True)}


def conv_silu(
    x: np.ndarray, tail: np.ndarray, w: np.ndarray, bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """SiLU of the causal depthwise convolution over x [T, D] (see the module docstring); w
    [D, W] as loaded (squeezed), bias [D] or None."""
    t = x.shape[0]
    k = w.shape[1] - 1
    x = np.ascontiguousarray(x)  # a view of the in-projection: the kernel's loops vectorize
    out = fused.conv(x, tail, w, bias, True)
    if t >= k:
        new_tail = np.array(x[t - k :], dtype=tail.dtype)
    else:
        new_tail = np.concatenate([tail[t:], x.astype(tail.dtype)], axis=0)
    return out, new_tail


def gated_norm(
    y: np.ndarray, z: np.ndarray, weight: np.ndarray | None, groups: int, eps: float, mode: str
) -> np.ndarray:
    """The gated RMSNorm of y [T, D] by z [T, D] over `groups` groups of D/groups (see the module
    docstring); weight [D] (None only for mode "gate").  Returns a new [T, D] in y's dtype."""
    out = np.empty(y.shape, dtype=y.dtype)
    y, z = np.ascontiguousarray(y), np.ascontiguousarray(z)  # views: the loops vectorize
    w = np.ones(y.shape[1], y.dtype) if weight is None else weight
    _NORM[worth_threads(y.size * _WORK_PER_ELEMENT)](
        y, z, w, int(groups), float(eps), GATED_NORM_MODES.index(mode), out
    )
    return out
