"""exp for the rule kernels: the additive kernel's vectorizable float32 exp where it exists.

`math.exp` compiles to a scalar libm call here (no SVML), which made the elu+1 map and the
in-chunk decay factors cost more than the chunk products.  ops/numba_backend.py carries a
polynomial float32 exp that LLVM vectorizes (its `_exp`, libm for float64); it is reused when
present, and plain `math.exp` serves otherwise (same values to ~1 ulp, slower).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numba

__all__ = ["fast_exp"]


@numba.njit(nogil=True, cache=True)
def _libm_exp(x: Any) -> Any:  # pragma: no cover - jitted
    return math.exp(x)


fast_exp: Any = getattr(importlib.import_module("..numba_backend", __package__), "_exp", _libm_exp)
