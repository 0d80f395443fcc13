"""The README's Python examples (other than the PyTorch one, run in tests/ops) run as written."""

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _block(word: str) -> str:
    return next(b for b in BLOCKS if word in b and "TorchEmbeddingModel" not in b)


def test_ops_example_continues_a_sequence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_block("causal_linear_attention"), str(README), "exec"), scope)
    assert scope["out"].shape == (1000, 8, 64)
    assert scope["out2"].shape == (3096, 8, 64)
    assert scope["state"].S.dtype == np.float64


def test_pipeline_example_embeds_and_checkpoints(tmp_path, monkeypatch):
    pytest.importorskip("apache_beam")
    from linstream.state import CheckpointStore

    monkeypatch.chdir(tmp_path)
    exec(compile(_block("EmbedSequences"), str(README), "exec"), {})
    store = CheckpointStore(str(tmp_path / "ckpt"))
    assert store.sequences() == ["doc-1"]
