"""Pretrained linear-attention checkpoints in flash-linear-attention's (fla's) format, streamed.

    from linstream.ops.model.fla import load_model
    model = load_model("path/to/folder")               # config.json + safetensors + tokenizer.json
    emb, states = model.embed_chunk(tokens, model.initial_states())

config          config.json read as fla 0.6.0 reads it; options the runtime lacks are refused
folder          the folder's files: safetensors (sharded or not), the tokenizer; `load_model`
tensor_files    safetensors read one tensor at a time, bfloat16 upcast once
runtime         FlaModel: the blocks, one chunk at a time, carried per-layer state
state           the per-layer state: named arrays of fixed shape
families        the family modules' interface and its defaults; head layouts, short convs
block           the model's layout (prefix, embedding, final norm) and fla's standard block
dense           Dense: every matrix product, made by the load's Weights factory
gla, retnet, delta_net, gated_deltanet, hgrn2
                one module per model_type: its config keys, tensors and token mixer
pieces          the layer pieces in NumPy (norms, SwiGLU, short conv, l2 norm, rotary, ...)
fused           Numba passes for the elementwise steps that cost (SwiGLU, SiLU)
"""

from .config import FAMILIES, FlaConfig, ModelFolderError
from .folder import load_model
from .runtime import FlaModel, LoadReport
from .state import LayerState, StateSpec

__all__ = [
    "FAMILIES",
    "FlaConfig",
    "FlaModel",
    "LayerState",
    "LoadReport",
    "ModelFolderError",
    "StateSpec",
    "load_model",
]
