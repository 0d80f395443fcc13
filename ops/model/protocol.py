"""What a model runtime offers the pipeline: the `StreamingModel` protocol, and `check_token_ids`,
the one check of a chunk's token ids.

Two runtimes satisfy the protocol: the built-in model (`runtime.EmbeddingModel`, states of S and
z per layer) and an fla checkpoint's (`fla.FlaModel`, named arrays per layer).  The stateful
stage (`linstream.pipeline.stage.steps.EmbedStep`) types against it and never asks which one it
holds:

    states = model.initial_states(np.float64)          # a sequence's start, one per layer
    emb, states = model.embed_chunk(ids, states)       # one chunk: [T, d_model] and the states
    arrays = model.stack_states(states, position)      # for a checkpoint: one array per name,
    states = model.unstack_states(arrays, position)    #   layers first (`state_layout`), and back
    model.check_inputs(ids)                            # what embed_chunk would refuse, no compute
    model.fingerprint                                  # names the model in every checkpoint

A chunk's token ids are checked by `check_token_ids` in both runtimes; an id outside the
vocabulary raises `UnknownTokenError` (a ValueError) that says which id, where, and how many.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["ModelInputs", "StateLayout", "StreamingModel", "UnknownTokenError", "check_token_ids"]

#: A carried state as a checkpoint stores it: (name, (layers, *shape)) per array, S first.
StateLayout = tuple[tuple[str, tuple[int, ...]], ...]


class ModelInputs(Protocol):
    """What a model's config says about its inputs and outputs."""

    @property
    def input_kind(self) -> str:
        """The kind of input: "tokens" (ids [T]) or "features" (vectors [T, input_dim])."""
        ...

    @property
    def vocab_size(self) -> int | None:
        """Token ids are 0..vocab_size-1 (None for a features model)."""
        ...

    @property
    def input_dim(self) -> int | None:
        """The width of a feature vector (None for a token model)."""
        ...

    @property
    def d_model(self) -> int:
        """The width of an embedding."""
        ...


@runtime_checkable
class StreamingModel(Protocol):
    """A loaded model that embeds one chunk at a time, carrying a fixed-size state per layer."""

    #: hex digest over everything that shapes the forward; checkpoints record it.
    fingerprint: str
    #: where it was loaded from ("builtin:NAME", a path or URL, "<model bytes>").
    source: str
    #: the dtype its products run in (float32 by default).
    compute_dtype: np.dtype

    @property
    def config(self) -> ModelInputs: ...

    def initial_states(self, dtype: npt.DTypeLike = np.float64) -> list[Any]:
        """The zero state of every layer (float64 by default, float32 selectable)."""
        ...

    def state_layout(self) -> StateLayout:
        """The carried state's arrays as a checkpoint stores them, S first."""
        ...

    def stack_states(self, states: Sequence[Any], position: int) -> dict[str, np.ndarray]:
        """Per-layer states as one array per name of `state_layout`, layers first."""
        ...

    def unstack_states(self, arrays: Mapping[str, np.ndarray], position: int) -> list[Any]:
        """The inverse of `stack_states` for a sequence at `position` (ValueError when the
        arrays are not this model's layout)."""
        ...

    def check_inputs(self, inputs: Any) -> None:
        """Raise what `embed_chunk` would raise for these inputs (TypeError, ValueError;
        `UnknownTokenError` for an id outside the vocabulary), without computing."""
        ...

    def embed_chunk(
        self, inputs: Any, states: Sequence[Any] | None, *, backend: str = "auto"
    ) -> tuple[np.ndarray, list[Any]]:
        """One chunk's embeddings [T, d_model] and the states after it (None: a sequence's
        start); neither the inputs nor the states are modified."""
        ...


class UnknownTokenError(ValueError):
    """A token id outside the model's vocabulary: ``token`` at ``position`` is the first of
    ``count`` such ids in the chunk; ids are 0..``vocab_size``-1."""

    def __init__(self, token: int, position: int, count: int, vocab_size: int) -> None:
        self.token, self.position, self.count, self.vocab_size = token, position, count, vocab_size
        msg = (
            f"unknown token id {token} at position {position}: the model's vocabulary has "
            f"{vocab_size} ids (0 to {vocab_size - 1})"
            + (f"; {count} ids out of range in all" if count > 1 else "")
        )
        super().__init__(msg)


def check_token_ids(x: np.ndarray, vocab_size: int) -> np.ndarray:
    """``x`` when it is a chunk of token ids: a 1-D integer array [T], T >= 1, every id in
    [0, vocab_size).  TypeError for another dtype, ValueError for another shape or an empty
    chunk, `UnknownTokenError` for an id outside the vocabulary."""
    if x.dtype.kind not in "iu":
        msg = f"token ids must be an integer array (e.g. int32 or int64), got dtype {x.dtype}"
        raise TypeError(msg)
    if x.ndim != 1:
        msg = f"token ids must be 1-D [T], got shape {x.shape}"
        raise ValueError(msg)
    if x.shape[0] == 0:
        msg = "empty chunk: token ids must hold at least one token, got shape (0,)"
        raise ValueError(msg)
    if x.min() >= 0 and x.max() < vocab_size:  # two reductions, no temporaries
        return x
    bad = np.flatnonzero((x < 0) | (x >= vocab_size))
    pos = int(bad[0])
    raise UnknownTokenError(int(x[pos]), pos, int(bad.size), int(vocab_size))
