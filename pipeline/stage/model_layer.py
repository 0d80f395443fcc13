"""Which hidden state an embedding step emits (`--layer`), checked against the model: a
checkpoint folder's models only, 0 (the embeddings) to L (the final norm).  No Beam here, so
that `linstream embed` checks `--layer` before Beam is imported."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["checked_layer", "is_folder_model"]


def is_folder_model(model: Any) -> bool:
    """Whether ``model`` is a checkpoint folder's (fla's format: named per-layer states)."""
    return hasattr(model, "state_layout")


def checked_layer(layer: Any, model: Any, folder: bool) -> int | None:
    """``layer`` checked against the model (ValueError saying what fits)."""
    if layer is None:
        return None
    if not folder:
        msg = (
            f"layer {layer!r}: picking a layer's output needs a checkpoint folder in fla's "
            f"format; model {getattr(model, 'source', '?')} gives its final output only"
        )
        raise ValueError(msg)
    n = int(model.num_layers)
    if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or not 0 <= layer <= n:
        msg = (
            f"layer must be an integer from 0 (the embeddings) to {n} (the final norm, the "
            f"default) for this {n}-layer model, got {layer!r}"
        )
        raise ValueError(msg)
    return int(layer)
