"""Pretrained linear-attention checkpoints in flash-linear-attention's (fla's) format, streamed.

    from linstream.ops.model.fla import load_model
    model = load_model("path/to/folder")               # config.json + safetensors + tokenizer.json
    emb, states = model.embed_chunk(tokens, model.initial_states())

config          config.json read as fla 0.6.0 reads it; options the runtime lacks are refused
folder          the folder's files: safetensors (sharded or not), the tokenizer; `load_model`
tensor_files    safetensors tensors one at a time in their stored dtype: mapped (local) or read
runtime         FlaModel: the blocks, one chunk at a time, carried per-layer state
state           the per-layer state: named arrays of fixed shape
cache_interchange
                the state as fla's cache object and back (`to_fla_cache`, `from_fla_cache`)
families        the family modules' interface and its defaults; head layouts, short convs
block           the model's layout (prefix, embedding, final norm) and fla's standard block
dense           Dense: every matrix product, made by the load's Weights factory (the modes)
bf16            the bfloat16 mode's products: MKL's bfloat16 GEMM, or weights widened
gla, retnet, delta_net, gated_deltanet, hgrn2
                one module per model_type: its config keys, tensors and token mixer
pieces          the layer pieces in NumPy (norms, SwiGLU, short conv, l2 norm, rotary, ...)
fused           Numba passes for the elementwise steps that cost (SwiGLU, SiLU)
"""

from .cache_interchange import FLA_CACHE_FAMILIES, from_fla_cache, to_fla_cache
from .config import FAMILIES, FlaConfig, ModelFolderError
from .folder import load_model
from .runtime import FlaModel, LoadReport
from .state import LayerState, StateSpec

__all__ = [
    "FAMILIES",
    "FLA_CACHE_FAMILIES",
    "FlaConfig",
    "FlaModel",
    "LayerState",
    "LoadReport",
    "ModelFolderError",
    "StateSpec",
    "from_fla_cache",
    "load_model",
    "to_fla_cache",
]
