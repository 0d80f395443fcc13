"""bfloat16 values for the tests: float32 rounded to bfloat16 (nearest even), as raw bits."""

from __future__ import annotations

import numpy as np

__all__ = ["bf16_round", "bf16_widen"]


def bf16_round(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bits as uint16, the float32 they stand for): round-to-nearest-even to bfloat16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = u.astype(np.uint16)
    return bits, bf16_widen(bits)


def bf16_widen(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bits (exact: the bits are the float32's top half)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)
