"""Produce the built-in models shipped in ops/model/builtin/ — deterministically, without torch.

    python -m linstream.ops.model.builtin          # (re)write builtin/default.safetensors
    python -m linstream.ops.model.builtin --check  # verify the shipped file, write nothing

"default" is an untrained model: its weights are `init_weights(config, seed=20261130)` (the
fixed initialization documented there; NumPy's PCG64 generator, float64 normals rounded to
float32), so it is a deterministic random-feature encoder of a token sequence's history.  It
exists for the demo and for end-to-end tests of the pipeline; train a model with the PyTorch twin
(`linstream.ops.model.twin`) for embeddings that mean something.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import ModelConfig
from .weights import fingerprint, init_weights, read_model, write_model

__all__ = ["BUILTIN_SPECS", "build", "main"]

# name -> (config, seed).  ~3.6 MB of float32 weights for "default".
BUILTIN_SPECS: dict[str, tuple[ModelConfig, int]] = {
    "default": (
        ModelConfig(
            input_kind="tokens",
            vocab_size=4096,
            d_model=128,
            n_layers=2,
            n_heads=4,
            d_head=32,
            d_ff=512,
            feature_map={"name": "elu+1"},
            eps=1e-6,
            normalization="layernorm",
            norm_eps=1e-5,
            activation="gelu_tanh",
        ),
        20261130,
    ),
}

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"


def build(name: str) -> tuple[ModelConfig, dict]:
    """The config and weights of built-in model `name`, computed afresh."""
    config, seed = BUILTIN_SPECS[name]
    return config, init_weights(config, seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m linstream.ops.model.builtin", description=__doc__)
    ap.add_argument("--check", action="store_true", help="verify the shipped files, write nothing")
    ap.add_argument("--out", type=Path, default=BUILTIN_DIR, help="folder to write into")
    args = ap.parse_args(argv)
    status = 0
    for name in BUILTIN_SPECS:
        config, weights = build(name)
        want = fingerprint(config, weights)
        path = args.out / f"{name}.safetensors"
        if args.check:
            got_config, got_weights = read_model(path)
            got = fingerprint(got_config, got_weights)
            ok = got == want
            status |= 0 if ok else 1
            print(f"{path}: {'ok' if ok else 'MISMATCH'} fingerprint {got} (expected {want})")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_model(path, config, weights)
            print(f"wrote {path} ({path.stat().st_size} bytes), fingerprint {want}")
    return status


if __name__ == "__main__":
    sys.exit(main())
