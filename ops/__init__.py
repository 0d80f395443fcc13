"""linstream.ops: causal linear attention math.  NumPy arrays in, arrays out; no Beam, no I/O."""

from .attention import causal_linear_attention, linear_attention
from .attention_state import AttentionState
from .backend import BackendUnavailableError, resolve_backend
from .feature_maps import FeatureMap, get_feature_map

__all__ = [
    "AttentionState",
    "BackendUnavailableError",
    "FeatureMap",
    "causal_linear_attention",
    "get_feature_map",
    "linear_attention",
    "resolve_backend",
]
