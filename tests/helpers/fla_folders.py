"""Checkpoint folders in fla's format written without torch: a config.json, random weights with
the names and shapes linstream's loader expects for that config, as safetensors (float32 or
bfloat16, one file or shards with an index), for the loader's tests and benchmarks.

    folder = write_folder(tmp_path / "m", TINY_GLA, dtype="BF16", shards=3, seed=0)

safetensors layout (its documented format): 8 bytes little-endian header length, the JSON
header (dtype, shape, data_offsets per tensor), then the bytes.  bfloat16 values are the top 16
bits of float32 values (rounded to nearest even), so `bf16_round` gives exactly what a loader
that upcasts correctly must hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TINY_CONFIGS", "bf16_round", "random_weights", "write_folder", "write_safetensors"]

#: Small configs (as fla writes them, keys it would fill in left to their defaults).
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "gla": {"model_type": "gla", "hidden_size": 32, "num_hidden_layers": 2, "num_heads": 2,
            "vocab_size": 50, "intermediate_size": 48, "use_short_conv": True},
    "retnet": {"model_type": "retnet", "hidden_size": 32, "num_hidden_layers": 2, "num_heads": 2,
               "vocab_size": 50, "intermediate_size": 48},
    "delta_net": {"model_type": "delta_net", "hidden_size": 32, "num_hidden_layers": 2,
                  "num_heads": 2, "vocab_size": 50, "intermediate_size": 48},
    "gated_deltanet": {"model_type": "gated_deltanet", "hidden_size": 32, "num_hidden_layers": 2,
                       "num_heads": 2, "head_dim": 8, "vocab_size": 50, "intermediate_size": 48},
    "hgrn2": {"model_type": "hgrn2", "hidden_size": 32, "num_hidden_layers": 2,
              "expand_ratio": 8, "vocab_size": 50, "intermediate_size": 48},
    # transformers' dialect (its Mamba2Config's keys); I = 64 = 8 heads × 8, 2 groups of 8
    "mamba2": {"model_type": "mamba2", "hidden_size": 32, "num_hidden_layers": 2,
               "num_heads": 8, "head_dim": 8, "state_size": 8, "n_groups": 2, "expand": 2,
               "vocab_size": 50, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True},
    "rwkv7": {"model_type": "rwkv7", "hidden_size": 32, "num_hidden_layers": 2, "head_dim": 16,
              "vocab_size": 50, "intermediate_size": 48, "decay_low_rank_dim": 8,
              "a_low_rank_dim": 8, "v_low_rank_dim": 4, "gate_low_rank_dim": 8},
}  # fmt: skip


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def random_weights(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """float32 weights for every tensor linstream's loader expects for config (plus lm_head),
    scaled so that activations stay O(1)."""
    from linstream.ops.model.fla.config import parse_config
    from linstream.ops.model.fla.folder import expected_tensors

    rng = np.random.default_rng(seed)
    shapes = expected_tensors(parse_config(config, source="<test>"))
    c = config
    shapes["lm_head.weight"] = (c["vocab_size"], c["hidden_size"])
    out = {}
    for name, shape in shapes.items():
        r = rng.standard_normal(shape).astype(np.float32)
        if name.endswith("norm.weight"):
            r = 1.0 + 0.1 * r
        elif len(shape) >= 2 and not name.endswith("embeddings.weight"):
            r /= np.sqrt(shape[-1])
        out[name] = r
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """Write tensors (float32 arrays) as F32 or BF16."""
    header: dict[str, Any] = {}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr, dtype=np.float32)
        raw = (bf16_round(a).view(np.uint32) >> 16).astype("<u2") if dtype == "BF16" else a
        data = raw.astype(raw.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for data in blobs:
            f.write(data)


def write_folder(
    folder: Path,
    config: dict[str, Any],
    *,
    weights: dict[str, np.ndarray] | None = None,
    dtype: str = "F32",
    shards: int = 1,
    seed: int = 0,
) -> Path:
    """A checkpoint folder: config.json, the weights (random for config unless given) in one
    model.safetensors or `shards` files with model.safetensors.index.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    w = random_weights(config, seed) if weights is None else weights
    if shards == 1:
        write_safetensors(folder / "model.safetensors", w, dtype)
        return folder
    names = list(w)
    wmap = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / fname, {n: w[n] for n in part}, dtype)
        wmap.update(dict.fromkeys(part, fname))
    index = {"metadata": {}, "weight_map": wmap}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder
