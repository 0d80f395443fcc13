"""The small models the tests share: named configurations and a model file written from one.

Tests that only need *a* model to run a job use these, so that a test's model is named for what
it is and written once, not spelled out again in every module.
"""

from __future__ import annotations

from linstream.ops.model.config import ModelConfig

__all__ = ["BYTES_TINY", "TOKENS_SMALL", "write_tiny_model"]

#: The smallest model that reads `builtin:bytes` ids (256 of them): jobs spend little time in it.
BYTES_TINY = ModelConfig(vocab_size=256, d_model=16, n_layers=1, n_heads=2, d_head=8, d_ff=32)

#: A two-layer model over a 13-token vocabulary, for runtime and device checks by hand-built ids.
TOKENS_SMALL = ModelConfig(vocab_size=13, d_model=8, n_layers=2, n_heads=2, d_head=4, d_ff=12)


def write_tiny_model(
    path: str, seed: int = 0, config: ModelConfig = BYTES_TINY, tokenizer: str | None = None
) -> str:
    """Write ``config`` with the fixed initialization of ``seed`` as a .safetensors file."""
    from linstream.ops.model.weights import init_weights, write_model

    write_model(path, config, init_weights(config, seed), tokenizer=tokenizer)
    return path
