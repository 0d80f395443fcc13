"""Mamba-2's time steps: the raw dt of each token and head made positive and clamped.

    step = time_steps(dt, dt_bias, (lo, hi))      # [T, H] float64
    step = time_steps(dt, dt_bias, (lo, hi), xp)  # the same in the namespace xp (CuPy: on
                                                  # the device, no copy to the host and back)

step = clamp(softplus(dt + dt_bias), lo, hi), with PyTorch's softplus (beta 1, threshold 20:
x itself above 20), as transformers' and fla's Mamba-2 form it; a NaN stays NaN.  The decay of
head h at that token is e^{step·A_h} (A_h = −exp(A_log_h) < 0), its input weight step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SOFTPLUS_THRESHOLD", "time_steps"]

SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus's default


def time_steps(dt: Any, dt_bias: Any, limit: tuple[float, float], xp: Any = np) -> Any:
    """dt [T, H] (any float dtype and strides), dt_bias [H] -> the time steps [T, H] float64,
    an array of the namespace xp (NumPy by default; dt and dt_bias NumPy or xp's arrays)."""
    z = xp.asarray(dt, dtype=xp.float64) + xp.asarray(dt_bias, dtype=xp.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        sp = xp.where(
            z > SOFTPLUS_THRESHOLD, z, xp.log1p(xp.exp(xp.minimum(z, SOFTPLUS_THRESHOLD)))
        )
    lo, hi = float(limit[0]), float(limit[1])
    return xp.minimum(xp.maximum(sp, lo), hi)
