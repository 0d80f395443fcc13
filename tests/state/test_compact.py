"""The working copy kept in Beam state: exact round trip, zero-copy, malformed buffers refused."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.store_faults import random_state
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.ops import AttentionState
from linstream.state import (
    CorruptCheckpointError,
    SequenceState,
    pack_layers,
    pack_state,
    unpack_state,
)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.tuples(*(st.integers(1, 4) for _ in range(4))),
    dtype=st.sampled_from(["float64", "float32"]),
)
def test_round_trip_is_exact(seed, shape, dtype):
    state = random_state(seed, shape, dtype=dtype)
    raw = pack_state(state)
    back = unpack_state(raw, expected_fingerprint=state.fingerprint)
    assert back == state
    assert not back.S.flags.writeable
    assert np.shares_memory(back.S, np.frombuffer(raw, np.uint8))  # a view, not a copy


def test_malformed_buffers_are_refused():
    raw = pack_state(random_state(1, (1, 2, 3, 4)))
    for bad in (raw[:10], raw[:-1], raw + b"x", b"XXXX" + raw[4:]):
        with pytest.raises(CorruptCheckpointError):
            unpack_state(bad)
    with pytest.raises(CorruptCheckpointError, match="another model"):
        unpack_state(raw, expected_fingerprint="0" * 64)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.tuples(*(st.integers(1, 4) for _ in range(4))),
    dtype=st.sampled_from(["float64", "float32"]),
)
def test_packing_layers_is_packing_their_stacked_state(seed, shape, dtype):
    state = random_state(seed, shape, dtype=dtype)
    # Writable, non-contiguous layers, as a step may return them.
    layers = [
        AttentionState(np.asfortranarray(layer.S), layer.z.copy()) for layer in state.layers()
    ]
    raw = pack_layers(state.seq_id, state.position, state.next_chunk, layers, state.fingerprint)
    stacked = SequenceState.from_layers(
        state.seq_id, state.position, state.next_chunk, layers, state.fingerprint
    )
    assert raw == pack_state(stacked) == pack_state(state)


def test_layers_it_cannot_pack_are_left_to_the_caller():
    state = random_state(2, (2, 2, 3, 4))
    layers = state.layers()
    mixed = [layers[0], AttentionState(layers[1].S.astype(np.float32), layers[1].z)]
    named = [{"S": layer.S, "z": layer.z} for layer in layers]
    other = [layers[0], AttentionState(layers[1].S[:1], layers[1].z[:1])]
    for bad in (mixed, named, other, []):
        assert pack_layers("s", 1, 1, bad, state.fingerprint) is None
    assert pack_layers("s", 2**63, 1, layers, state.fingerprint) is None
    assert pack_layers("\ud800", 1, 1, layers, state.fingerprint) is None
