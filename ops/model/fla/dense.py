"""The fla runtime's matrix products: one weight object (`Dense`) for every x @ Wᵀ, made by one
factory (`Weights`) that the loader hands to each family's `build`.

    weights = Weights(np.float32)                  # the compute dtype (float32 or float64)
    o_proj = weights.dense(tensors["o_proj.weight"])           # Dense: W [out, in] as loaded
    y = o_proj(x)                                  # x [T, in] -> x @ Wᵀ [T, out]
    qkv = weights.fused([("q", wq), ("k", wk), ("v", wv)])      # one product, split by name
    p = qkv(x); p["q"], p["k"], p["v"]             # views of one [T, Σ out] result
    norm_w = weights.array(tensors["o_norm.weight"])            # anything else: a plain array
    a_log = weights.array(tensors["A_log"], np.float64)         # ... in a dtype of its own

The contract (what a family may rely on, and what a bfloat16 mode may change):

- A family never assumes how the loader hands it a tensor: every tensor goes through the
  factory, `weights.dense` / `weights.fused` for each matrix it multiplies by, `weights.array`
  for every other tensor (norm weights, biases, convolution weights, a gate's small tensors),
  which it gets as a NumPy array in the compute dtype `weights.dtype` (or the dtype it asks).
- A Dense's product takes x [T, in] in the compute dtype and returns [T, out] in the compute
  dtype; how the weight is held (`Dense.weight`, its dtype) and how the product is formed are
  the Dense's own.  A bfloat16 mode changes only this module (weights held in 16 bits, bf16
  products accumulated in float32) and the loader's read; the families stay as they are.
- Inside `split_rows(split)` (the runtime's forward) a product's rows run in the ranges of
  `split` (`linstream.ops.model.threads.row_split`: ranges fixed by the number of rows alone,
  BLAS at one thread, each range one BLAS call), so its bits do not depend on the thread count.
  `weights.dense(w, split=False)` is one call over all rows, for a product too small to be
  worth ranges (GLA's rank-16 gate); also independent of the thread count.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Dense", "FusedProjection", "RowSplit", "Weights", "split_rows"]

RowSplit = Callable[[Callable[[slice], None], int], None]
_SPLIT: contextvars.ContextVar[RowSplit | None] = contextvars.ContextVar("rows", default=None)


@contextlib.contextmanager
def split_rows(split: RowSplit | None) -> Iterator[None]:
    """Within this block (on this thread), every Dense runs its product through ``split``
    (`linstream.ops.model.threads.row_split`); None: one call over all rows."""
    token = _SPLIT.set(split)
    try:
        yield
    finally:
        _SPLIT.reset(token)


def _project(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w.T for w [out, in], the rows in the ranges of the current `split_rows`
    (each range one BLAS call on its own rows)."""
    split = _SPLIT.get()
    if split is None:
        return x @ w.T
    y = np.empty((x.shape[0], w.shape[0]), dtype=np.result_type(x, w))

    def rows(r: slice) -> None:
        np.matmul(x[r], w.T, out=y[r])

    split(rows, x.shape[0])
    return y


class Dense:
    """A projection: x [T, in] @ Wᵀ for its weight W [out, in] (a linear layer without bias),
    held read-only in the compute dtype."""

    __slots__ = ("split", "weight")

    def __init__(self, weight: np.ndarray, *, split: bool = True) -> None:
        self.weight = weight
        self.weight.setflags(write=False)
        self.split = split

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in)."""
        out, inp = self.weight.shape
        return int(out), int(inp)

    def arrays(self) -> list[np.ndarray]:
        """What the Dense holds (for the model's held bytes)."""
        return [self.weight]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return _project(x, self.weight) if self.split else x @ self.weight.T


class FusedProjection:
    """Several projections of one input as one Dense: W [Σ out, in] concatenated at load from
    the named [out, in] weights (which are not kept); the result split by name."""

    __slots__ = ("dense", "slices")

    def __init__(self, dense: Dense, slices: dict[str, slice]) -> None:
        self.dense = dense
        self.slices = slices

    def arrays(self) -> list[np.ndarray]:
        return self.dense.arrays()

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        y = self.dense(x)
        return {name: y[:, s] for name, s in self.slices.items()}


class Weights:
    """The factory of a load's weights: `dense`, `fused` and `array` in the compute dtype
    `dtype` (see the module docstring for the contract)."""

    def __init__(self, dtype: npt.DTypeLike) -> None:
        self.dtype = np.dtype(dtype)

    def array(self, tensor: Any, dtype: npt.DTypeLike | None = None) -> np.ndarray:
        """A tensor as loaded, as a NumPy array in `dtype` (default: the compute dtype)."""
        return np.asarray(tensor, dtype=self.dtype if dtype is None else dtype)

    def dense(self, tensor: Any, *, split: bool = True) -> Dense:
        """The projection of a weight [out, in] as loaded."""
        return Dense(self.array(tensor), split=split)

    def fused(self, parts: Sequence[tuple[str, Any]]) -> FusedProjection:
        """One projection of several named weights [out_i, in] of one input."""
        slices: dict[str, slice] = {}
        start = 0
        for name, w in parts:
            slices[name] = slice(start, start + w.shape[0])
            start += w.shape[0]
        weight = np.concatenate([self.array(w) for _, w in parts], axis=0)
        return FusedProjection(Dense(weight), slices)
