"""RWKV-7 (fla's `RWKV7ForCausalLM`) and Mamba-2 (transformers' `Mamba2ForCausalLM`) from the
models' own classes on the CPU: random-weight checkpoint folders saved with `save_pretrained`
(safetensors), and the models' forward on them, for the benchmarks against llama.cpp and the
oracles.

    folder = write_model_folder(tmp_path / "rwkv7", "rwkv7", size="tiny", seed=0)
    folder = write_model_folder(tmp_path / "mamba2", "mamba2", size="bench")
    folder = cached_model_folder(cache / "models", "mamba2", "bench", seed=7)  # kept, reused
    model = load_model(folder, "rwkv7")                  # eval mode, float32, runs on the CPU
    hidden, logits = run_model(model, ids)               # [T, hidden], [T, vocab] (NumPy)

Sizes: "bench" is the ~190M RWKV-7 (191.0M parameters, 90.4M without embeddings) and ~130M
Mamba-2 (129.0M, tied embeddings, 90.4M without) that the families' benchmarks race llama.cpp
on; "tiny" keeps every option of the bench model at a few hundred thousand parameters (the
head size stays 64, which llama.cpp's RWKV-7 group-norm eps assumes; Mamba-2 keeps the GPT-NeoX
vocabulary size so that llama.cpp's built-in tokenizer yields ids the model has).

An RWKV-7 folder also gets `rwkv_vocab_v20230424.txt` with the 256 single bytes (RWKV's
"world" vocabulary format, `<id> <python repr of the bytes> <length>`, ids 1..256), which
llama.cpp's converter requires; a Mamba-2 folder has no tokenizer files (the converter then
uses its built-in GPT-NeoX vocabulary).  The weights are randomized by the fla oracle's
`randomize_` (every tensor non-trivial, activations O(1)); RWKV-7's token-shift mixes,
Mamba-2's `D` and the LayerNorm biases are then drawn in their working ranges.

Building needs no kernels: fla's modules import Triton (installed with torch) but launch
nothing at construction.  Running fla's RWKV-7 uses `helpers.fla_oracle_rwkv7`'s rebinding to
fla's torch references; transformers' Mamba-2 runs its pure-torch path (no `mamba_ssm` or
`causal_conv1d` here).

transformers 5.24's Mamba-2 on the CPU: whole-sequence forwards agree with each other over any
prefix, but a continuation through its cache (`past_key_values`, with or without
`cache_position`) does not reproduce the whole-sequence logits; compare splits against
whole-sequence runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from helpers.fla_oracle import patch_fla_for_cpu, randomize_

__all__ = [
    "CONFIGS",
    "RWKV_VOCAB_FILE",
    "cached_model_folder",
    "load_model",
    "model_class",
    "model_config",
    "parameter_counts",
    "run_model",
    "write_model_folder",
    "write_rwkv_vocab",
]

RWKV_VOCAB_FILE = "rwkv_vocab_v20230424.txt"

#: Keyword arguments of fla's RWKV7Config and transformers' Mamba2Config, per family and size.
# fmt: off
CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "rwkv7": {
        "bench": dict(hidden_size=768, num_hidden_layers=12, head_dim=64, intermediate_size=3072,
                      decay_low_rank_dim=64, a_low_rank_dim=64, v_low_rank_dim=32,
                      gate_low_rank_dim=128, vocab_size=65536, norm_eps=1e-5,
                      tie_word_embeddings=False, fuse_norm=False),
        "tiny": dict(hidden_size=128, num_hidden_layers=2, head_dim=64, intermediate_size=256,
                     decay_low_rank_dim=16, a_low_rank_dim=16, v_low_rank_dim=8,
                     gate_low_rank_dim=16, vocab_size=320, norm_eps=1e-5,
                     tie_word_embeddings=False, fuse_norm=False),
    },
    "mamba2": {
        "bench": dict(hidden_size=768, num_hidden_layers=24, state_size=128, head_dim=64,
                      num_heads=24, expand=2, n_groups=1, conv_kernel=4, vocab_size=50288,
                      tie_word_embeddings=True, use_bias=False, use_conv_bias=True,
                      layer_norm_epsilon=1e-5, residual_in_fp32=True, chunk_size=256),
        "tiny": dict(hidden_size=64, num_hidden_layers=2, state_size=16, head_dim=16,
                     num_heads=8, expand=2, n_groups=1, conv_kernel=4, vocab_size=50288,
                     tie_word_embeddings=True, use_bias=False, use_conv_bias=True,
                     layer_norm_epsilon=1e-5, residual_in_fp32=True, chunk_size=32),
    },
}
# fmt: on


def model_config(family: str, size: str = "tiny", **overrides: Any) -> Any:
    """The family's own config object ("rwkv7": fla's RWKV7Config, "mamba2": transformers'
    Mamba2Config) for a size in CONFIGS, with overrides."""
    if family not in CONFIGS or size not in CONFIGS[family]:
        raise ValueError(
            f"expected a family in {sorted(CONFIGS)} and a size in "
            f"{sorted(CONFIGS.get(family, {}))}, got {family!r}, {size!r}"
        )
    kwargs = {**CONFIGS[family][size], **overrides}
    if family == "rwkv7":
        patch_fla_for_cpu()  # fla's imports (and its Auto* registration)
        from fla.models import RWKV7Config

        return RWKV7Config(**kwargs)
    from transformers import Mamba2Config

    return Mamba2Config(**kwargs)


def model_class(family: str) -> Any:
    """The family's own model class: fla's RWKV7ForCausalLM, transformers' Mamba2ForCausalLM.
    (Named, not found through AutoModelForCausalLM: once fla is imported, the Auto classes map
    "mamba2" folders to fla's own Mamba-2.)"""
    if family == "rwkv7":
        patch_fla_for_cpu()
        from fla.models import RWKV7ForCausalLM

        return RWKV7ForCausalLM
    if family == "mamba2":
        from transformers import Mamba2ForCausalLM

        return Mamba2ForCausalLM
    raise ValueError(f"expected a family in {sorted(CONFIGS)}, got {family!r}")


def write_rwkv_vocab(folder: str | os.PathLike[str]) -> Path:
    """RWKV's world vocabulary file with the 256 single bytes (ids 1..256); its path."""
    path = Path(folder) / RWKV_VOCAB_FILE
    path.write_text("".join(f"{i + 1} {bytes([i])!r} 1\n" for i in range(256)), encoding="utf-8")
    return path


@torch.no_grad()
def _working_ranges(model: torch.nn.Module, seed: int) -> None:
    """After randomize_: the tensors whose meaning needs a range (token-shift mixes in [0, 1],
    Mamba-2's skip D around 1, LayerNorm biases near 0)."""
    gen = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if (leaf.startswith("x_") and "attn" in name) or name.endswith("ffn.x_k"):
            p.copy_(torch.rand(p.shape, generator=gen))
        elif leaf == "D":
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif leaf == "bias" and "norm" in name:
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def write_model_folder(
    folder: str | os.PathLike[str],
    family: str,
    size: str = "tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    config: Any = None,
    **save_kwargs: Any,
) -> Path:
    """Build the family's model (config from `model_config(family, size)` unless given),
    randomize it (seeded), save it to `folder` in `dtype` with save_pretrained (plus the RWKV
    vocabulary file for RWKV-7); returns the folder."""
    folder = Path(folder)
    config = config if config is not None else model_config(family, size)
    torch.manual_seed(seed)
    model = model_class(family)(config)
    randomize_(model, seed)
    _working_ranges(model, seed)
    model.to(dtype).save_pretrained(folder, **save_kwargs)
    if family == "rwkv7":
        write_rwkv_vocab(folder)
    return folder


def cached_model_folder(
    root: str | os.PathLike[str], family: str, size: str = "bench", seed: int = 0
) -> Path:
    """write_model_folder's folder kept under root and reused by later calls: named by family,
    size, seed and a key of the config, this module's source and fla's, transformers' and
    torch's versions; written under a temporary name and renamed once complete, so that
    concurrent and interrupted runs never see half a folder."""
    import fla
    import transformers

    versions = [fla.__version__, transformers.__version__, torch.__version__]
    src = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    key = json.dumps([CONFIGS[family][size], seed, versions, src], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    folder = Path(root) / f"{family}-{size}-seed{seed}-{digest}"
    if (folder / "config.json").is_file():
        return folder
    tmp = folder.with_name(f"{folder.name}.part{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_model_folder(tmp, family, size, seed=seed)
    try:
        tmp.rename(folder)
    except OSError:  # another process renamed its copy first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def parameter_counts(folder: str | os.PathLike[str]) -> tuple[int, int]:
    """(all parameters, parameters without the embedding and output matrices) of a saved
    folder, read from its safetensors headers (a tied output matrix counted once)."""
    from safetensors import safe_open

    total = embed = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():  # noqa: SIM118  (safe_open has no __iter__)
                n = st.get_slice(name).get_shape()
                count = 1
                for d in n:
                    count *= d
                total += count
                if "embed" in name or name.startswith("lm_head"):
                    embed += count
    return total, total - embed


def load_model(
    folder: str | os.PathLike[str], family: str, dtype: torch.dtype = torch.float32
) -> Any:
    """The family's own model loaded from folder, in eval mode and dtype, ready for the CPU
    (fla's RWKV-7 with its Triton calls rebound; transformers' Mamba-2 without hub kernels)."""
    if family == "rwkv7":
        from helpers.fla_oracle_rwkv7 import patch_rwkv7_for_cpu

        patch_rwkv7_for_cpu()
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if family == "mamba2":
        kwargs["use_kernels"] = False
    return model_class(family).from_pretrained(str(folder), **kwargs).to(dtype).eval()


@torch.no_grad()
def run_model(model: Any, ids: Any) -> tuple[Any, Any]:
    """(final hidden states [T, hidden], logits [T, vocab]) as NumPy for token ids [T], one
    whole-sequence forward (the hidden states are after the final norm)."""
    x = torch.as_tensor(ids, dtype=torch.long)[None]
    out = model(x, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1][0].numpy(), out.logits[0].numpy()
