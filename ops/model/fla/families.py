"""What the family modules (gla, retnet, delta_net, gated_deltanet, hgrn2) share: the interface
the runtime calls, a fused input projection, the head layouts and the short convolutions.

A family module defines

    parse(reader, common) -> Spec                 its layer settings (a frozen dataclass)
    attn_tensors(spec, common) -> {name: shape}   a layer's tensors under `layers.{i}.attn.`
    model_tensors(spec, common) -> {name: shape}  tensors outside the blocks (HGRN2's lower
                                                  bounds), under the model prefix
    build(spec, common, tensors, dtype, index, model_tensors) -> Mixer

and a Mixer maps a chunk's normed input x [T, hidden] and the layer's LayerState to
(output [T, hidden], the new LayerState), in the compute dtype of its weights.  Its matrix
products go through `project` (x @ W.T), which splits a long chunk's rows across threads when
the runtime's forward asks for it (`split_rows`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from .pieces import short_conv
from .state import LayerState, StateSpec

__all__ = [
    "ConvSet",
    "FusedProjection",
    "Mixer",
    "family_module",
    "head_major",
    "project",
    "row_major",
    "split_rows",
]

RowSplit = Callable[[Callable[[slice], None], int], None]
_SPLIT: contextvars.ContextVar[RowSplit | None] = contextvars.ContextVar("rows", default=None)


@contextlib.contextmanager
def split_rows(split: RowSplit | None) -> Iterator[None]:
    """Within this block (on this thread), `project` runs its products through ``split``
    (`linstream.ops.model.threads.row_split`: row ranges on helper threads, the caller taking
    back any range no helper started; None: one call)."""
    token = _SPLIT.set(split)
    try:
        yield
    finally:
        _SPLIT.reset(token)


def project(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w.T for w [out, in]; the rows in ranges across threads inside `split_rows`
    (each range one BLAS call on its own rows: the same products, row by row)."""
    split = _SPLIT.get()
    if split is None:
        return x @ w.T
    y = np.empty((x.shape[0], w.shape[0]), dtype=np.result_type(x, w))

    def rows(r: slice) -> None:
        np.matmul(x[r], w.T, out=y[r])

    split(rows, x.shape[0])
    return y


class Mixer(Protocol):
    state_spec: StateSpec

    def forward(self, x: np.ndarray, state: LayerState) -> tuple[np.ndarray, LayerState]: ...


def family_module(name: str) -> ModuleType:
    """The module of model_type `name` (a checked member of config.FAMILIES)."""
    return importlib.import_module(f"{__package__}.{name}")


class FusedProjection:
    """Several projections of one input as one matrix product: x @ W.T with W [Σ out, hidden]
    built once at load from the named [out, hidden] weights (which are not kept)."""

    def __init__(self, parts: list[tuple[str, np.ndarray]], dtype: np.dtype) -> None:
        self.slices: dict[str, slice] = {}
        start = 0
        for name, w in parts:
            self.slices[name] = slice(start, start + w.shape[0])
            start += w.shape[0]
        self.weight = np.concatenate([np.asarray(w, dtype=dtype) for _, w in parts], axis=0)
        self.weight.setflags(write=False)

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        y = project(x, self.weight)
        return {name: y[:, s] for name, s in self.slices.items()}


def head_major(x: np.ndarray, d: int, repeat: int = 1) -> np.ndarray:
    """[T, n·d] -> a new contiguous [n·repeat, T, d], each head repeated `repeat` times in place
    (head i of the result is head i // repeat of x: fla's grouped key/value heads)."""
    t = x.shape[0]
    h = np.ascontiguousarray(x.reshape(t, -1, d).transpose(1, 0, 2))
    return np.repeat(h, repeat, axis=0) if repeat > 1 else h


def row_major(o: np.ndarray) -> np.ndarray:
    """[H, T, d] -> [T, H, d] (a view)."""
    return o.transpose(1, 0, 2)


class ConvSet:
    """A layer's short convolutions: weights [D, W] by name, their tails carried as `conv_<name>`
    state arrays [W−1, D].  `silu` names the ones followed by SiLU."""

    def __init__(
        self, weights: Mapping[str, np.ndarray], silu: set[str] | frozenset[str], dtype: np.dtype
    ) -> None:
        self.w = {
            n: np.ascontiguousarray(np.asarray(a)[:, 0, :], dtype=dtype) for n, a in weights.items()
        }
        self.silu = frozenset(silu)

    def state_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"conv_{n}", (w.shape[1] - 1, w.shape[0])) for n, w in self.w.items()]

    def __call__(
        self, name: str, x: np.ndarray, state: Mapping[str, np.ndarray], new: dict[str, Any]
    ) -> np.ndarray:
        """conv `name` over x [T, D] from the state's tail; the new tail goes into `new`."""
        y, tail = short_conv(x, state[f"conv_{name}"], self.w[name], name in self.silu)
        new[f"conv_{name}"] = tail
        return y
