"""Which hidden state an embedding step emits (`--layer`), checked against the model: a model
that gives every layer's output (a checkpoint folder's), 0 (the embeddings) to L (the final
norm).  No Beam here, so that `linstream embed` checks `--layer` before Beam is imported."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["checked_layer"]


def checked_layer(layer: Any, model: Any) -> int | None:
    """``layer`` checked against the model (ValueError saying what fits)."""
    if layer is None:
        return None
    if not hasattr(model, "hidden_states"):
        msg = (
            f"layer {layer!r}: picking a layer's output needs a checkpoint folder in fla's "
            f"format; model {getattr(model, 'source', '?')} gives its final output only"
        )
        raise ValueError(msg)
    n = int(getattr(model, "num_layers"))  # noqa: B009
    if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or not 0 <= layer <= n:
        msg = (
            f"layer must be an integer from 0 (the embeddings) to {n} (the final norm, the "
            f"default) for this {n}-layer model, got {layer!r}"
        )
        raise ValueError(msg)
    return int(layer)
