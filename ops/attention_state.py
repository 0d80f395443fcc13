"""The carried state of causal linear attention: S [H, d_k, d_v] and z [H, d_k]."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["AttentionState"]


class AttentionState(NamedTuple):
    """Per-head running sums after some prefix of a sequence.

    S: [H, d_k, d_v], the sum of φ(k_t) v_tᵀ.  z: [H, d_k], the sum of φ(k_t).
    d_k is the width of the *feature-mapped* key (FAVOR+ maps d_k to its feature count).
    """

    S: np.ndarray
    z: np.ndarray

    @classmethod
    def zeros(
        cls, heads: int, d_k: int, d_v: int, dtype: npt.DTypeLike = np.float64
    ) -> AttentionState:
        return cls(np.zeros((heads, d_k, d_v), dtype=dtype), np.zeros((heads, d_k), dtype=dtype))

    @property
    def heads(self) -> int:
        return int(self.S.shape[0])

    @property
    def d_k(self) -> int:
        return int(self.S.shape[1])

    @property
    def d_v(self) -> int:
        return int(self.S.shape[2])

    @property
    def dtype(self) -> np.dtype:
        return self.S.dtype

    def copy(self) -> AttentionState:
        return AttentionState(self.S.copy(), self.z.copy())
