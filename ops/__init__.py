"""linstream.ops: causal linear attention math.  NumPy arrays in, arrays out; no Beam, no I/O."""

from .attention import causal_linear_attention, linear_attention
from .attention_state import AttentionState
from .backend import BackendUnavailableError, resolve_backend
from .feature_maps import FeatureMap, get_feature_map
from .model_config import ModelConfig
from .model_runtime import EmbeddingModel, builtin_models, load_model
from .model_weights import ModelFileError
from .rules import RULES

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
