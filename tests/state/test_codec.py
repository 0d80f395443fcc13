"""The Arrow codec: bit-exact round trips, zero-copy reads, and refusal of damaged input."""

import numpy as np
import pyarrow as pa
import pytest
from helpers.store_faults import random_state, rewrite_state_file
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.state import (
    FORMAT_VERSION,
    CorruptCheckpointError,
    ModelMismatchError,
    NonFiniteStateError,
    SequenceState,
    UnsupportedFormatVersionError,
    decode_state,
    encode_state,
)

dims = st.integers(1, 5)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(dims, dims, dims, dims),
    dtype=st.sampled_from(["float64", "float32"]),
    seed=st.integers(0, 2**32 - 1),
    seq_id=st.text(max_size=40),
    position=st.integers(0, 2**63 - 1),
    next_chunk=st.integers(0, 2**63 - 1),
    scale_exp=st.integers(-300, 300),
)
def test_round_trip_is_bit_exact(shape, dtype, seed, seq_id, position, next_chunk, scale_exp):
    rng = np.random.default_rng(seed)
    scale = 10.0 ** (scale_exp if dtype == "float64" else scale_exp // 10)
    S = (rng.standard_normal(shape) * scale).astype(dtype)
    z = (rng.standard_normal(shape[:3]) * scale).astype(dtype)
    S.flat[0] = -0.0  # signed zero must survive too
    if S.size > 1:
        S.flat[1] = np.finfo(dtype).tiny / 2  # a subnormal
    state = SequenceState(seq_id, position, next_chunk, S, z, "fp" + str(seed))
    back = decode_state(encode_state(state), expected_fingerprint=state.fingerprint)
    assert back == state
    assert back.S.tobytes() == S.tobytes() and back.z.tobytes() == z.tobytes()
    assert back.dtype == np.dtype(dtype)


def test_decode_is_zero_copy_and_read_only():
    state = random_state(0, (2, 3, 4, 5))
    data = encode_state(state)
    back = decode_state(data)
    lo = np.frombuffer(data, np.uint8).ctypes.data
    addr = back.S.ctypes.data
    assert lo <= addr < lo + len(data), "S should be a view of the input bytes"
    assert not back.S.flags.writeable and not back.z.flags.writeable
    # a mutable input buffer is copied, so later writes to it cannot change the value
    buf = bytearray(data)
    back2 = decode_state(buf)
    buf[:] = bytes(len(buf))
    assert back2 == state


def test_schema_is_fixed_shape_tensor_with_metadata():
    state = random_state(1, (2, 3, 4, 5), dtype="float32")
    schema = pa.ipc.open_file(pa.py_buffer(encode_state(state))).schema
    assert schema.names == ["seq_id", "position", "next_chunk", "S", "z"]
    assert isinstance(schema.field("S").type, pa.FixedShapeTensorType)
    assert list(schema.field("S").type.shape) == [2, 3, 4, 5]
    assert list(schema.field("z").type.shape) == [2, 3, 4]
    assert schema.field("S").type.value_type == pa.float32()
    meta = {k.decode(): v.decode() for k, v in schema.metadata.items()}
    assert meta["linstream.format_version"] == str(FORMAT_VERSION) == "2"
    assert meta["linstream.min_reader_version"] == "2"
    assert meta["linstream.fingerprint"] == state.fingerprint
    assert meta["linstream.state_dtype"] == "float32"
    assert meta["linstream.digest"].startswith("sha256:")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_is_refused(bad):
    state = random_state(2)
    S = state.S.copy()
    S[0, 0, 0, 0] = bad
    with pytest.raises(NonFiniteStateError, match="NaN or Inf"):
        encode_state(SequenceState("s", 1, 1, S, state.z, "fp"))


def _tensor_offsets(data: bytes, state: SequenceState) -> list[int]:
    out = []
    for arr in (state.S, state.z):
        raw = arr.tobytes()
        at = data.find(raw)
        assert at >= 0
        out.extend(range(at, at + len(raw)))
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_tensor_bit_flip_is_detected(dtype):
    """Arrow has no checksum: without the digest these flips would read back silently."""
    state = random_state(3, (2, 2, 3, 4), dtype=dtype)
    data = encode_state(state)
    offsets = _tensor_offsets(data, state)
    for i, off in enumerate(offsets):
        damaged = bytearray(data)
        damaged[off] ^= 1 << (i % 8)
        with pytest.raises(CorruptCheckpointError, match="digest"):
            decode_state(bytes(damaged))


@pytest.mark.parametrize("cut", [0, 8, "half", -1], ids=["0", "8", "half", "size-1"])
def test_truncated_bytes_are_corrupt(cut):
    data = encode_state(random_state(4))
    n = {"half": len(data) // 2, -1: len(data) - 1}.get(cut, cut)
    with pytest.raises(CorruptCheckpointError):
        decode_state(data[:n])


def test_garbage_is_corrupt():
    with pytest.raises(CorruptCheckpointError, match="Arrow"):
        decode_state(b"PAR1" + bytes(100))
    with pytest.raises(TypeError, match="bytes"):
        decode_state("text")  # type: ignore[arg-type]


def test_other_model_is_refused():
    data = encode_state(random_state(5, fingerprint="a" * 64))
    with pytest.raises(ModelMismatchError, match="another model"):
        decode_state(data, expected_fingerprint="b" * 64)


def test_newer_format_names_both_versions():
    data = rewrite_state_file(
        encode_state(random_state(6)), metadata={"format_version": "4", "min_reader_version": "4"}
    )
    with pytest.raises(UnsupportedFormatVersionError, match=r"version 4.*1 to 3") as info:
        decode_state(data)
    assert (info.value.found, info.value.supported) == (4, 3)


@pytest.mark.parametrize("version", ["1", "4"])
def test_format_readable_by_this_reader_is_read(version):
    # Format 1 (older) and a newer format that declares this reader able to read it.
    state = random_state(7)
    data = rewrite_state_file(
        encode_state(state), metadata={"format_version": version, "min_reader_version": "1"}
    )
    assert decode_state(data) == state


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"metadata": {"state_dtype": "float32"}}, "state dtype float32"),
        ({"metadata": {"state_dtype": "int8"}}, "float64 or float32"),
        ({"metadata": {"digest": "md5:00"}}, "digest"),
        ({"metadata": {"format_version": "x"}}, "format_version"),
        ({"columns": {"z": "wrong-shape"}}, "shapes"),
        ({"columns": {"S": "float32"}}, "state dtype"),
        ({"columns": {"S": "plain-list"}}, "fixed_shape_tensor"),
        ({"columns": {"position": "int32"}}, "column position"),
        ({"columns": {"extra": "x"}}, "columns"),
    ],
    ids=[
        "dtype-meta",
        "bad-dtype",
        "digest-form",
        "version-form",
        "z-shape",
        "S-dtype",
        "S-type",
        "pos-type",
        "extra-col",
    ],
)
def test_wrong_schema_shape_or_dtype_is_corrupt(change, match):
    state = random_state(8)
    cols = {}
    for name, kind in change.get("columns", {}).items():
        if kind == "wrong-shape":
            cols[name] = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((1, 2, 2, 4)))
        elif kind == "float32":
            cols[name] = pa.FixedShapeTensorArray.from_numpy_ndarray(
                state.S.astype(np.float32).reshape(1, *state.S.shape)
            )
        elif kind == "plain-list":
            cols[name] = pa.array([state.S.ravel()], pa.list_(pa.float64()))
        elif kind == "int32":
            cols[name] = pa.array([state.position], pa.int32())
        else:
            cols[name] = pa.array([kind])
    data = rewrite_state_file(encode_state(state), metadata=change.get("metadata"), columns=cols)
    with pytest.raises(CorruptCheckpointError, match=match):
        decode_state(data)


def test_identity_fields_are_checked():
    data = encode_state(random_state(9, seq_id="a", position=5, next_chunk=2))
    with pytest.raises(CorruptCheckpointError, match="sequence id"):
        decode_state(data, expected_seq_id="b")
    with pytest.raises(CorruptCheckpointError, match="position"):
        decode_state(data, expected_position=6)
    with pytest.raises(CorruptCheckpointError, match="next chunk"):
        decode_state(data, expected_next_chunk=3)
