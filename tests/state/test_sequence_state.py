"""SequenceState: an immutable value, per-layer conversion to and from AttentionState."""

import dataclasses

import numpy as np
import pytest
from helpers.store_faults import random_state
from linstream.ops import AttentionState
from linstream.state import SequenceState


def test_arrays_are_copied_and_read_only():
    S = np.ones((1, 2, 3, 4))
    z = np.ones((1, 2, 3))
    st = SequenceState("s", 0, 0, S, z, "fp")
    S[...] = 5.0  # the caller's array changes; the value must not
    assert float(st.S.max()) == 1.0
    with pytest.raises(ValueError, match="read-only"):
        st.S[0, 0, 0, 0] = 2.0
    with pytest.raises(ValueError, match="read-only"):
        st.layers()[0].z[0, 0] = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.position = 3  # type: ignore[misc]


def test_read_only_view_of_writable_base_is_copied():
    base = np.zeros((1, 1, 2, 2))
    view = base.view()
    view.setflags(write=False)
    st = SequenceState("s", 0, 0, view, np.zeros((1, 1, 2)), "fp")
    base[...] = 1.0
    assert float(st.S.sum()) == 0.0


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_layers_round_trip(dtype):
    rng = np.random.default_rng(3)
    layers = [
        AttentionState(rng.random((2, 3, 4)).astype(dtype), rng.random((2, 3)).astype(dtype))
        for _ in range(3)
    ]
    st = SequenceState.from_layers("s", 10, 2, layers, "fp")
    assert st.dtype == np.dtype(dtype)
    assert st.state_shape == (3, 2, 3, 4)
    for got, want in zip(st.layers(copy=True), layers, strict=True):
        np.testing.assert_array_equal(got.S, want.S)
        np.testing.assert_array_equal(got.z, want.z)
        got.S[...] = 0  # copies are writable and independent
    assert float(np.abs(st.S).sum()) > 0
    layers[0].S[...] = -1  # the value copied its inputs
    assert float(st.S.min()) >= 0


def test_initial_and_advanced():
    st = SequenceState.initial("s", (2, 1, 3, 4), "fp", dtype=np.float32)
    assert (st.position, st.next_chunk, st.dtype) == (0, 0, np.float32)
    assert not st.S.any() and not st.z.any()
    nxt = st.advanced(st.layers(copy=True), tokens=5)
    assert (nxt.position, nxt.next_chunk, nxt.dtype) == (5, 1, np.float32)


def test_equality_is_bit_exact():
    a = random_state(1)
    b = random_state(1)
    assert a == b and hash(a) == hash(b)
    c = dataclasses.replace(a, S=np.nextafter(a.S, np.inf))
    assert a != c


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"S": np.zeros((1, 2, 3)), "z": np.zeros((1, 2))}, ValueError, r"S \[L, H, F, d_v\]"),
        ({"S": np.zeros((1, 2, 3, 4)), "z": np.zeros((1, 2, 4))}, ValueError, "received S"),
        ({"S": np.zeros((1, 1, 1, 1), np.int64)}, TypeError, "float64 or float32"),
        ({"S": np.zeros((1, 1, 1, 1), np.float16)}, TypeError, "float64 or float32"),
        ({"z": np.zeros((1, 1, 1), np.float32)}, TypeError, "same dtype"),
        ({"position": -1}, ValueError, "position"),
        ({"position": 1.5}, TypeError, "position"),
        ({"seq_id": 3}, TypeError, "seq_id"),
        ({"seq_id": "\ud800"}, ValueError, "UTF-8"),
        ({"S": [[[[0.0]]]]}, TypeError, "numpy arrays"),
    ],
    ids=[
        "ndim",
        "shape",
        "int",
        "f16",
        "mixed",
        "neg-pos",
        "float-pos",
        "id-type",
        "surrogate",
        "list",
    ],
)
def test_validation_says_expected_and_received(kwargs, error, match):
    fields = {
        "seq_id": "s",
        "position": 0,
        "next_chunk": 0,
        "S": np.zeros((1, 1, 1, 1)),
        "z": np.zeros((1, 1, 1)),
        "fingerprint": "fp",
    } | kwargs
    with pytest.raises(error, match=match):
        SequenceState(**fields)


def test_from_layers_rejects_mixed_layers():
    a = AttentionState.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"layers\[1\]"):
        SequenceState.from_layers("s", 0, 0, [a, AttentionState.zeros(2, 3, 5)], "fp")
    with pytest.raises(TypeError, match=r"layers\[1\]"):
        SequenceState.from_layers("s", 0, 0, [a, AttentionState.zeros(2, 3, 4, np.float32)], "fp")
    with pytest.raises(ValueError, match="at least one"):
        SequenceState.from_layers("s", 0, 0, [], "fp")
