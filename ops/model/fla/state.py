"""What an fla model carries between chunks: per layer, a few named arrays of fixed shape.

    S        [H, d_k, d_v]   the recurrent state (always key-major: S_t = … + k_t v_tᵀ, y = Sᵀq)
    conv_*   [W−1, D]        a short convolution's tail: the last W−1 raw inputs it has seen
    position [1] int64       tokens consumed (RetNet's rotary positions start there)

`StateSpec` says which a layer has and their shapes; `LayerState` is one layer's values.  The
sizes never depend on how many tokens were seen.  fla's own cache keeps GLA, HGRN2 and Gated
DeltaNet states value-major ([H, d_v, d_k]) and W raw inputs per convolution; these are the
same numbers, transposed, and without the oldest input (which no later output reads).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["POSITION", "LayerState", "StateSpec"]

POSITION = "position"


@dataclass(frozen=True)
class StateSpec:
    """One layer's state: name -> shape, in order.  `position` (if present) is int64; the other
    arrays are in the state dtype (float64 by default, float32 selectable)."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    def names(self) -> list[str]:
        return [n for n, _ in self.shapes]

    def zeros(self, dtype: np.dtype) -> LayerState:
        return LayerState(
            {n: np.zeros(s, dtype=np.int64 if n == POSITION else dtype) for n, s in self.shapes}
        )

    def nbytes(self, dtype: np.dtype) -> int:
        size = np.dtype(dtype).itemsize
        return sum(int(np.prod(s)) * (8 if n == POSITION else size) for n, s in self.shapes)


class LayerState(Mapping[str, np.ndarray]):
    """One layer's carried state: named arrays (read-only views of arrays no one else holds).

    A layer's forward returns a new LayerState and never writes the one it was given."""

    __slots__ = ("_arrays",)

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        frozen = {}
        for name, a in arrays.items():
            arr = np.asarray(a)
            view = arr.view()
            view.setflags(write=False)
            frozen[name] = view
        self._arrays = frozen

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the floating arrays (the state dtype)."""
        for name, a in self._arrays.items():
            if name != POSITION:
                return a.dtype
        return np.dtype(np.float64)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self._arrays.values())

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}{list(a.shape)}" for n, a in self._arrays.items())
        return f"LayerState({parts}, {self.dtype})"
