"""linstream.ops: causal linear attention math.  NumPy arrays in, arrays out; no Beam, no I/O.

The names below are imported on first use (PEP 562), so that a module needing one light name
(``linstream.state`` needs only ``AttentionState``) does not load Numba and every kernel.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# first: OpenMP's wait policy, before anything can load Numba's OpenMP (`omp_wait`)
from . import omp_wait  # noqa: F401

if TYPE_CHECKING:
    from linstream.ops.model.config import ModelConfig
    from linstream.ops.model.runtime import EmbeddingModel, builtin_models, load_model
    from linstream.ops.model.weights import ModelFileError

    from .attention import causal_linear_attention, linear_attention
    from .attention_state import AttentionState
    from .backend import BackendUnavailableError, resolve_backend
    from .feature_maps import FeatureMap, get_feature_map
    from .rules import RULES

#: public name -> the submodule that defines it
_HOMES = {
    "RULES": "rules",
    "AttentionState": "attention_state",
    "BackendUnavailableError": "backend",
    "EmbeddingModel": "model.runtime",
    "FeatureMap": "feature_maps",
    "ModelConfig": "model.config",
    "ModelFileError": "model.weights",
    "builtin_models": "model.runtime",
    "causal_linear_attention": "attention",
    "get_feature_map": "feature_maps",
    "linear_attention": "attention",
    "load_model": "model.runtime",
    "resolve_backend": "backend",
}

__all__ = [
    "RULES",
    "AttentionState",
    "BackendUnavailableError",
    "EmbeddingModel",
    "FeatureMap",
    "ModelConfig",
    "ModelFileError",
    "builtin_models",
    "causal_linear_attention",
    "get_feature_map",
    "linear_attention",
    "load_model",
    "resolve_backend",
]
assert sorted(__all__) == sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
