"""Mamba-2's time steps: the raw dt of each token and head made positive and clamped.

    step = time_steps(dt, dt_bias, (lo, hi))      # [T, H] float64

step = clamp(softplus(dt + dt_bias), lo, hi), with PyTorch's softplus (beta 1, threshold 20:
x itself above 20), as transformers' and fla's Mamba-2 form it; a NaN stays NaN.  The decay of
head h at that token is e^{step·A_h} (A_h = −exp(A_log_h) < 0), its input weight step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SOFTPLUS_THRESHOLD", "time_steps"]

SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus's default


def time_steps(dt: Any, dt_bias: Any, limit: tuple[float, float]) -> np.ndarray:
    """dt [T, H] (any float dtype and strides), dt_bias [H] -> the time steps [T, H] float64."""
    z = np.asarray(dt, np.float64) + np.asarray(dt_bias, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        sp = np.where(
            z > SOFTPLUS_THRESHOLD, z, np.log1p(np.exp(np.minimum(z, SOFTPLUS_THRESHOLD)))
        )
    lo, hi = float(limit[0]), float(limit[1])
    return np.minimum(np.maximum(sp, lo), hi)
