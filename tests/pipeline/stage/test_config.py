"""The stage's options: one checked value, given to a transform as keyword arguments (the names
README documents) or whole."""

from __future__ import annotations

import pytest
from linstream.pipeline import CausalLinearAttention, EmbedSequences
from linstream.pipeline.stage.config import StageConfig


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"emit": "all"}, "emit must be one of"),
        ({"checkpoint_every": 0}, "checkpoint_every must be >= 1, got 0"),
        ({"max_buffered_chunks": -1}, "max_buffered_chunks must be >= 0 or None, got -1"),
        ({"resume": True}, "resume=True needs a checkpoint_dir to resume from"),
        (
            {"output_dir": "o"},
            "output_dir (outputs written with the commits) needs a checkpoint_dir",
        ),
        ({"block_tokens": 0}, "max_chunk_tokens and block_tokens must be >= 1, got 1048576 and 0"),
    ],
)
def test_a_bad_option_is_refused_when_the_transform_is_built(kw, words):
    with pytest.raises(ValueError, match="^" + words.replace("(", r"\(").replace(")", r"\)")):
        CausalLinearAttention(**kw)


def test_the_documented_keywords_set_the_stage_and_unknown_ones_are_refused():
    t = EmbedSequences(
        "builtin:default", checkpoint_dir="ckpt/", checkpoint_every=16, resume=True, emit="mean"
    )
    assert t.config == StageConfig(
        checkpoint_dir="ckpt/", checkpoint_every=16, resume=True, emit="mean"
    )
    assert t.model.config.d_model > 0
    base = StageConfig(checkpoint_dir="c", checkpoint_every=3)
    t2 = CausalLinearAttention(backend="numpy", stage=base, checkpoint_every=5)
    assert t2.config == StageConfig(checkpoint_dir="c", checkpoint_every=5)
    assert CausalLinearAttention(stage=base).config == base
    with pytest.raises(TypeError, match="CausalLinearAttention\\(\\) got an unexpected keyword"):
        CausalLinearAttention(checkpoint_dri="c")
    with pytest.raises(TypeError, match="EmbedSequences\\(\\) got an unexpected keyword"):
        EmbedSequences("builtin:default", feature_map="relu")
