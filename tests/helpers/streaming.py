"""A model runtime streamed over chunk splits, for the tests that compare it with one pass.

    bounds = random_bounds(rng, t, small=(1,))              # [0, cuts..., t], seeded
    hs, states = stream_hidden_states(model, ids, bounds)   # L + 1 arrays [t, hidden]
    emb, states = stream_embeddings(model, ids, bounds)     # [t, hidden] (embed_chunk's)
    outs, states = stream_chunks(model, chunks)             # {(seq_id, index): emb}
    err = worst(hs, reference)                              # largest |difference| of any layer

Each carries the states from one call to the next exactly as a user does (`model.hidden_states`
or `model.embed_chunk` per piece, the state of one handed to the next): a runtime whose state
drops anything the past contributes gives other outputs than the one pass it is compared with.
The comparison and its tolerance stay in each test (they depend on the reference).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "random_bounds",
    "stream",
    "stream_chunks",
    "stream_embeddings",
    "stream_hidden_states",
    "worst",
]


def random_bounds(
    rng: np.random.Generator, t: int, *, max_cuts: int = 5, small: Sequence[int] = (1,)
) -> list[int]:
    """[0, ..., t]: 0 to max_cuts cut points drawn in 1..t−1, plus (with probability 0.3) the
    `small` ones (pieces of a token or two at the start, shorter than any conv tail; none drawn
    when empty: the draws are then those of the cuts alone)."""
    cuts = rng.integers(1, t, size=int(rng.integers(0, max_cuts + 1))).tolist()
    return sorted({0, t, *cuts, *(small if small and rng.random() < 0.3 else [])})


def stream(step: Callable[[Any, Any], tuple[Any, Any]], pieces: Iterable[Any], states: Any = None):
    """step(piece, states) -> (out, states) over the pieces in order: ([out...], final states)."""
    outs = []
    for piece in pieces:
        out, states = step(piece, states)
        outs.append(out)
    return outs, states


def _pieces(ids: Any, bounds: Sequence[int]) -> list[Any]:
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


def stream_hidden_states(model: Any, ids: Any, bounds: Sequence[int], states: Any = None):
    """The runtime's hidden states (`model.hidden_states`) over the pieces [a, b) of bounds,
    each layer's concatenated, and the final states."""
    outs, states = stream(model.hidden_states, _pieces(ids, bounds), states)
    return [np.concatenate(layer) for layer in zip(*outs, strict=True)], states


def stream_embeddings(
    model: Any, ids: Any, bounds: Sequence[int], states: Any = None, *, layer: int | None = None
):
    """`model.embed_chunk` over the pieces [a, b) of bounds: (the embeddings concatenated, the
    final states)."""
    outs, states = stream(
        lambda piece, st: model.embed_chunk(piece, st, layer=layer), _pieces(ids, bounds), states
    )
    return np.concatenate(outs), states


def stream_chunks(
    model: Any, chunks: Iterable[Any], states: Any = None, *, layer: int | None = None
):
    """`model.embed_chunk` over pipeline chunks in the given order: ({(seq_id, index): emb},
    the final states)."""
    chunks = list(chunks)
    outs, states = stream(lambda c, st: model.embed_chunk(c.data, st, layer=layer), chunks, states)
    return {(c.seq_id, c.index): e for c, e in zip(chunks, outs, strict=True)}, states


def worst(got: Sequence[Any], ref: Sequence[Any]) -> float:
    """The largest absolute difference between matching arrays (as float64) of two lists of the
    same length."""
    assert len(got) == len(ref), (len(got), len(ref))
    return max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        for a, b in zip(got, ref, strict=True)
    )
