"""The constants the DPLR kernels share, Numba and CUDA alike (no Numba import, so that the CUDA
wrapper loads where Numba is not installed)."""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_DPLR_CHUNK", "SPAN"]

# Chunk length (tests/bench/test_bench_dplr.py measures 16, 32 and 64 at RWKV-7 191M's shape).
DEFAULT_DPLR_CHUNK = 32
#: The most the decays inside a chunk (after its first token) may sum to, by compute dtype.
SPAN = {np.dtype(np.float32): 40.0, np.dtype(np.float64): 300.0}
