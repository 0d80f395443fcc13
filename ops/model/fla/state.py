"""What an fla model carries between chunks: per layer, a few named arrays of fixed shape.

    S        [H, d_k, d_v]   the recurrent state (always key-major: S_t = … + k_t v_tᵀ, y = Sᵀq)
    conv_*   [W−1, D]        a short convolution's tail: the last W−1 raw inputs it has seen
    position [1] int64       tokens consumed (RetNet's rotary positions start there)

`StateSpec` says which a layer has and their shapes; `LayerState` is one layer's values.  The
sizes never depend on how many tokens were seen.  fla's own cache keeps GLA, HGRN2 and Gated
DeltaNet states value-major ([H, d_v, d_k]) and W raw inputs per convolution; these are the
same numbers, transposed, and without the oldest input (which no later output reads).

A checkpoint holds every layer's arrays stacked, one array per name with the layers first
(`stack_states`, `unstack_states`); the position is not stored there but rebuilt from the
sequence's own position (the tokens it has consumed), and checked against it on the way back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "POSITION",
    "LayerState",
    "StateSpec",
    "stack_states",
    "stacked_layout",
    "unstack_states",
]

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


def stacked_layout(specs: Sequence[StateSpec]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The layers' state as stacked arrays: (name, (L, *shape)) for every name but the position,
    in the specs' order (S first).  Every layer of these models carries the same arrays."""
    first = specs[0]
    for i, spec in enumerate(specs):
        if spec != first:
            msg = f"layer {i} carries {spec.shapes}, layer 0 {first.shapes}: not one layout"
            raise ValueError(msg)
    return tuple((n, (len(specs), *s)) for n, s in first.shapes if n != POSITION)


def stack_states(states: Sequence[LayerState], position: int) -> dict[str, np.ndarray]:
    """One array per name, layers first; each layer's position (where it has one) must equal
    `position`, which is left out (the sequence's position stands for it)."""
    names = [n for n in states[0] if n != POSITION]
    for i, st in enumerate(states):
        if POSITION in st and int(st[POSITION][0]) != position:
            msg = (
                f"layer {i} is at position {int(st[POSITION][0])}, the sequence at {position}: "
                "a state must advance by the tokens it consumed"
            )
            raise ValueError(msg)
        if [n for n in st if n != POSITION] != names:
            msg = f"layer {i} holds {list(st)}, layer 0 {list(states[0])}"
            raise ValueError(msg)
    return {n: np.stack([st[n] for st in states]) for n in names}


def unstack_states(
    specs: Sequence[StateSpec], arrays: Mapping[str, np.ndarray], position: int
) -> list[LayerState]:
    """Per-layer states (read-only views of `arrays`) for a sequence at `position`: the inverse
    of `stack_states`.  ValueError when the arrays are not the specs' layout."""
    layout = dict(stacked_layout(specs))
    shapes = {n: tuple(a.shape) for n, a in arrays.items()}
    if shapes != layout:
        msg = f"a state of {shapes} does not fit the model, which carries {layout}"
        raise ValueError(msg)
    pos = np.array([position], dtype=np.int64)
    out = []
    for i, spec in enumerate(specs):
        layer = {n: (pos if n == POSITION else arrays[n][i]) for n, _ in spec.shapes}
        out.append(LayerState(layer))
    return out
