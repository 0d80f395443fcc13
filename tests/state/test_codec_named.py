"""States of named tensors (an fla model's: S, the short convolutions' tails; no z): checkpoint
format 3 round-trips bit-exactly and refuses every damaged or forged file by name; the working
copy and the store carry them; states of S and z stay format 2."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest
from helpers.store_faults import (
    compressed_state_file,
    random_named_state,
    random_state,
    rewrite_state_file,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.state import (
    CheckpointStore,
    CorruptCheckpointError,
    DivergentStateError,
    History,
    ModelMismatchError,
    NonFiniteStateError,
    SupersededError,
    UnsupportedFormatVersionError,
    codec,
    decode_state,
    encode_state,
    pack_state,
    unpack_state,
)
from linstream.state.errors import StateBoundsError
from linstream.state.store.paths import data_name_commit

FP = "f" * 64


def _meta(data: bytes) -> dict[str, str]:
    schema = pa.ipc.open_file(pa.py_buffer(data)).schema
    return {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}


@st.composite
def named_states(draw):
    layers = draw(st.integers(1, 3))
    S = draw(st.tuples(*(st.integers(1, 4) for _ in range(3))))
    names = draw(st.lists(st.from_regex(r"[a-y][a-z0-9_]{0,6}", fullmatch=True), max_size=4))
    extra = {n: draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)) for n in set(names)}
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from(["float64", "float32"]))
    with_z = draw(st.booleans())
    state = random_named_state(
        seed,
        layers,
        {n: tuple(s) for n, s in extra.items()},
        S=S,
        dtype=dtype,
        position=draw(st.integers(0, 2**40)),
        next_chunk=draw(st.integers(0, 2**20)),
        seq_id=draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)),
    )
    if with_z:
        z = np.random.default_rng(seed).uniform(0.5, 2, (layers, *S[:2])).astype(dtype)
        state = dataclasses.replace(state, z=z)
    return state


@settings(max_examples=40, deadline=None)
@given(state=named_states())
def test_round_trip_is_bit_exact(state):
    data = encode_state(state)
    back = decode_state(data, expected_fingerprint=FP)
    assert back == state
    assert back.layout == state.layout
    meta = _meta(data)
    if state.classic:  # S and z alone (no other tensor drawn): format 2, as before
        assert meta["linstream.format_version"] == "2" and "linstream.layout" not in meta
        return
    assert (meta["linstream.format_version"], meta["linstream.min_reader_version"]) == ("3", "3")
    assert json.loads(meta["linstream.layout"]) == [[n, list(s)] for n, s in state.layout]
    for a in back.tensors.values():  # zero-copy, read-only views of the file's bytes
        assert not a.flags.writeable
        assert np.shares_memory(a, np.frombuffer(data, np.uint8))


@settings(max_examples=30, deadline=None)
@given(state=named_states())
def test_working_copy_round_trip_is_exact(state):
    raw = pack_state(state)
    back = unpack_state(raw, expected_fingerprint=FP)
    assert back == state and back.layout == state.layout


def test_working_copy_refuses_malformed_buffers():
    raw = pack_state(random_named_state(1))
    assert raw[:4] == b"LSW2"
    for bad in (raw[:10], raw[:-1], raw + b"x", raw.replace(b'"conv_q"', b'"conv_Q"')):
        with pytest.raises(CorruptCheckpointError):
            unpack_state(bad)
    with pytest.raises(CorruptCheckpointError, match="another model"):
        unpack_state(raw, expected_fingerprint="0" * 64)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_tensor_bit_flip_is_detected(dtype):
    state = random_named_state(2, dtype=dtype)
    data = encode_state(state)
    base = np.frombuffer(data, np.uint8).ctypes.data
    rng = np.random.default_rng(5)
    print("bit-flip seed 5")
    for name, a in decode_state(data).tensors.items():
        start = a.ctypes.data - base
        for off in rng.integers(start, start + a.nbytes, 12):
            damaged = bytearray(data)
            damaged[off] ^= 1 << int(rng.integers(8))
            with pytest.raises(CorruptCheckpointError, match="digest"):
                decode_state(bytes(damaged))
        assert start >= 0 and start + a.nbytes <= len(data), name


def _layout_json(layout) -> str:
    return json.dumps([[n, list(s)] for n, s in layout], separators=(",", ":"))


def _forged_layouts(state):
    L = state.S.shape[0]
    good = list(state.layout)
    yield "other-shape", _layout_json([*good[:1], ("conv_q", (L, 4, 8)), *good[2:]]), "shapes"
    yield "not-canonical", json.dumps([[n, list(s)] for n, s in good]), "canonical"
    yield "twice", _layout_json([*good, good[1]]), "twice"
    yield "no-S-first", _layout_json(good[1:] + good[:1]), "S"
    yield "bad-name", _layout_json([*good[:1], ("../x", (L, 3, 8))]), "plain lowercase"
    yield "other-layers", _layout_json([*good[:1], ("conv_q", (L + 1, 3, 8))]), "layers"
    yield "huge", _layout_json([*good[:1], ("conv_q", (L, 1 << 24, 1 << 24))]), "more than"
    yield "not-json", "[[", "not JSON"
    yield "deep", "[" * 20000 + "]" * 20000, "more than"


@pytest.mark.parametrize("case", [c for c, _, _ in _forged_layouts(random_named_state(3))], ids=str)
def test_forged_layout_is_corrupt(case):
    state = random_named_state(3)
    _, layout, match = next(f for f in _forged_layouts(state) if f[0] == case)
    data = rewrite_state_file(encode_state(state), metadata={"layout": layout})
    with pytest.raises(CorruptCheckpointError, match=match):
        decode_state(data)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"metadata": {"format_version": "2", "min_reader_version": "2"}}, "format 2"),
        ({"columns": {"tensor.extra": "x"}}, "columns"),
        ({"columns": {"tensor.conv_k": "float32"}}, "state dtype"),
        ({"columns": {"tensor.conv_k": "plain-list"}}, "fixed_shape_tensor"),
        ({"columns": {"tensor.conv_k": "wrong-shape"}}, "shapes"),
        ({"metadata": {"digest": "sha256:" + "0" * 64}}, "digest"),
        ({"metadata": {"fingerprint": "e" * 64}}, "another model"),
    ],
    ids=["layout-in-v2", "extra-col", "dtype", "list", "shape", "digest", "model"],
)
def test_forged_schema_is_refused(change, match):
    state = random_named_state(4)
    cols = {}
    for name, kind in change.get("columns", {}).items():
        a = state.extra["conv_k"]
        if kind == "float32":
            cols[name] = pa.FixedShapeTensorArray.from_numpy_ndarray(
                a.astype(np.float32).reshape(1, *a.shape)
            )
        elif kind == "plain-list":
            cols[name] = pa.array([a.ravel()], pa.list_(pa.float64()))
        elif kind == "wrong-shape":
            cols[name] = pa.FixedShapeTensorArray.from_numpy_ndarray(a.reshape(1, -1, 4))
        else:
            cols[name] = pa.array([kind])
    data = rewrite_state_file(encode_state(state), metadata=change.get("metadata"), columns=cols)
    error = ModelMismatchError if match == "another model" else CorruptCheckpointError
    with pytest.raises(error, match=match):
        decode_state(data, expected_fingerprint=FP)


def test_a_format_2_reader_refuses_named_states(monkeypatch):
    data = encode_state(random_named_state(5))
    monkeypatch.setattr(codec, "READER_VERSION", 2)
    with pytest.raises(UnsupportedFormatVersionError, match=r"version >= 3.*1 to 2"):
        decode_state(data)
    assert decode_state(encode_state(random_state(5))) == random_state(5)  # format 2 still is


def test_non_finite_tensors_are_refused_on_encode_and_decode():
    state = random_named_state(6)
    conv = state.extra["conv_v"].copy()
    conv[1, 2, 3] = np.nan
    bad = dataclasses.replace(state, extra={**state.extra, "conv_v": conv})
    with pytest.raises(NonFiniteStateError):
        encode_state(bad)
    forged = codec.encode_checked(bad, finite_checked=True)[0].to_pybytes()  # a valid digest
    with pytest.raises(CorruptCheckpointError, match="NaN or Inf in conv_v"):
        decode_state(forged)


def test_compressed_named_state_is_refused_before_allocating():
    big = random_named_state(7, 1, {"conv_q": (512, 1024)})
    big = dataclasses.replace(big, extra={"conv_q": np.zeros((1, 512, 1024))})
    with pytest.raises(StateBoundsError, match="compressed"):
        decode_state(compressed_state_file(encode_state(big)))


def test_store_commits_restores_and_compares_every_tensor(tmp_path):
    store = CheckpointStore(str(tmp_path), background_prune=False)
    state = random_named_state(8)
    assert str(store.commit(state)) == "committed"
    assert store.restore(state.seq_id, fingerprint=FP) == state
    manifest = json.loads(next(tmp_path.rglob("*.commit.json")).read_bytes())
    assert (manifest["format_version"], manifest["min_reader_version"]) == (3, 3)
    assert manifest["shape"] == list(state.S.shape)
    assert "tensor_ranges" not in manifest  # no split hash: the file's sha256 covers it
    assert data_name_commit(manifest["data_file"]) == 1  # the data file names its commit
    # A retried commit whose only difference is in a convolution tail: within the float64
    # tolerance (1e-5 of the tensor's largest magnitude) it is the same state ...
    conv = state.extra["conv_k"]
    near = dataclasses.replace(state, extra={**state.extra, "conv_k": conv * (1 + 1e-9)})
    assert str(store.commit(near)) == "equal_within_tolerance"
    # ... beyond it, a divergence, though S and the other tails are bit-equal.
    far = conv.copy()
    far[0, 0, 0] += 1e-3 * np.abs(conv).max()
    with pytest.raises(DivergentStateError, match="relative difference"):
        store.commit(dataclasses.replace(state, extra={**state.extra, "conv_k": far}))
    other = random_named_state(8, extra={"conv_q": (3, 8)})
    with pytest.raises(DivergentStateError, match="conv_q"):
        store.commit(other)
    with pytest.raises(ModelMismatchError):
        store.restore(state.seq_id, fingerprint="e" * 64)


def test_a_fenced_writer_of_named_states_leaves_the_winners_files(tmp_path):
    """The store's ownership rules hold for format 3: a late writer that commits the winner's
    very state at the same position under a number another history took is refused and
    removes only its own data file; verify finds nothing wrong, nothing orphaned."""

    def at(seed, position, next_chunk):
        return random_named_state(seed, seq_id="s", position=position, next_chunk=next_chunk)

    root = str(tmp_path / "ckpt")
    same = at(2, 12, 3)
    winner = CheckpointStore(root, background_prune=False)
    winner.commit(at(1, 4, 1), History(1, 0, -1, b""))
    winner.commit(at(3, 8, 2), History(2, 4, -1, b""))
    winner.commit(same, History(3, 8, -1, b""))
    late = CheckpointStore(root, background_prune=False)
    with pytest.raises(SupersededError):
        late.commit(same, History(2, 4, -1, b""))
    assert winner.verify() == [] and winner.orphans() == []
    assert winner.restore("s", fingerprint=FP) == same
    names = sorted(p.name for p in (tmp_path / "ckpt").rglob("*.arrow"))
    assert [data_name_commit(n) for n in names] == [2, 3], names  # retention kept two
