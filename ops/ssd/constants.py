"""The constants the SSD kernels share, Numba and CUDA alike (no Numba import, so that the CUDA
wrapper loads where Numba is not installed)."""

from __future__ import annotations

__all__ = ["DEFAULT_SSD_CHUNK"]

# Chunk length: a chunk costs n·P multiply-adds a token for M @ X beside the 2·N·P of the
# state's two products, and each product is a BLAS call on small matrices.
DEFAULT_SSD_CHUNK = 64
