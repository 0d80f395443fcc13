"""Both runtimes, the built-in model and an fla checkpoint's, are `StreamingModel`s: a state
stacked for a checkpoint and unstacked again continues the sequence exactly, and a token id
outside the vocabulary is refused by the one check both use."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.fla_folders import TINY_CONFIGS, write_folder
from linstream.ops import load_model
from linstream.ops.model.protocol import StreamingModel, UnknownTokenError

SEED = 5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = write_folder(tmp_path_factory.mktemp("fla") / "gla", TINY_CONFIGS["gla"], seed=SEED)
    return {"builtin": load_model("builtin:default"), "fla": load_model(str(folder))}


@pytest.mark.parametrize("name", ["builtin", "fla"])
def test_a_state_stacked_and_unstacked_continues_the_sequence_exactly(models, name):
    model = models[name]
    assert isinstance(model, StreamingModel)
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    ids = rng.integers(0, 50, size=30).astype(np.int32)
    _, states = model.embed_chunk(ids[:17], model.initial_states())
    arrays = model.stack_states(states, 17)
    assert [(n, a.shape) for n, a in arrays.items()] == list(model.state_layout())
    want, _ = model.embed_chunk(ids[17:], states)
    got, _ = model.embed_chunk(ids[17:], model.unstack_states(arrays, 17))
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="does not fit the model"):
        model.unstack_states({**arrays, "S": arrays["S"][:1]}, 17)


@pytest.mark.parametrize("name", ["builtin", "fla"])
def test_an_unknown_token_id_is_refused_by_the_one_check(models, name):
    model = models[name]
    vocab = model.config.vocab_size
    with pytest.raises(UnknownTokenError) as caught:
        model.check_inputs(np.array([1, vocab, -1, 2]))
    ex = caught.value
    assert (ex.token, ex.position, ex.count, ex.vocab_size) == (vocab, 1, 2, vocab)
    assert str(ex) == (
        f"unknown token id {vocab} at position 1: the model's vocabulary has {vocab} ids "
        f"(0 to {vocab - 1}); 2 ids out of range in all"
    )
