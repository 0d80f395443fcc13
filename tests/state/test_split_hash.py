"""The manifest's split hash: one pass over the tensor bytes on restore checks every byte of the
file and the content digest, and manifests stay readable by format-1 readers (which ignore the
extra fields and check ``sha256``)."""

import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pytest
from helpers.store_faults import flip_bit, random_state, reseal_manifest, write_raw_commit
from hypothesis import given, settings
from hypothesis import strategies as hst
from linstream.state import CheckpointStore, CorruptCheckpointError, decode_state, encode_state
from linstream.state import codec as codec_mod
from linstream.state.codec import DigestHint, digest_of_bytes, state_digest, tensor_ranges
from linstream.state.store import commit as store_mod  # where a commit encodes its state
from linstream.state.store.manifest import split_file_hash

FP = "f" * 64


def _manifest(info):
    with open(info.manifest_path, "rb") as f:
        return json.loads(f.read())


def _commit(tmp_path, st):
    store = CheckpointStore(str(tmp_path))
    assert store.commit(st) == "committed"
    return store, store.commits(st.seq_id)[0]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_manifest_keeps_the_format_1_fields_and_adds_the_split_hash(tmp_path, dtype):
    st = random_state(0, (2, 3, 4, 5), dtype=dtype)
    _store, info = _commit(tmp_path, st)
    m = _manifest(info)
    with open(info.data_path, "rb") as f:
        data = f.read()
    # a format-1 reader checks these two: they are what they always were
    assert m["sha256"] == hashlib.sha256(data).hexdigest()
    assert m["digest"] == state_digest(st.seq_id, st.position, st.next_chunk, FP, st.S, st.z)
    assert (m["format_version"], m["min_reader_version"]) == (2, 2)
    s_off, s_len, z_off, z_len = m["tensor_ranges"]
    assert data[s_off : s_off + s_len] == st.S.tobytes()
    assert data[z_off : z_off + z_len] == st.z.tobytes()
    assert m["split_sha256"] == split_file_hash(data, tuple(m["tensor_ranges"]), m["digest"])


def test_restore_hashes_the_tensor_bytes_once(tmp_path, monkeypatch):
    st = random_state(1, (2, 4, 16, 16))  # 16 KiB of tensors, ~3 KiB of the rest
    store, _info = _commit(tmp_path, st)
    calls = []
    real_sha256 = hashlib.sha256

    def counting_sha256(*args):
        calls.extend(memoryview(a).nbytes for a in args)
        return _Counting(real_sha256(*args), calls)

    monkeypatch.setattr(store_mod.hashlib, "sha256", counting_sha256)
    monkeypatch.setattr(codec_mod.hashlib, "sha256", counting_sha256)
    assert store.restore(st.seq_id, fingerprint=FP) == st
    tensor_bytes = st.S.nbytes + st.z.nbytes
    assert sum(calls) < 2 * tensor_bytes  # one pass (plus the small rest), not two


class _Counting:
    def __init__(self, h, calls):
        self._h, self._calls = h, calls

    def update(self, data):
        self._calls.append(memoryview(data).nbytes)
        self._h.update(data)

    def hexdigest(self):
        return self._h.hexdigest()


def test_damage_before_the_manifest_hashed_the_file_is_caught(tmp_path, monkeypatch):
    """A tensor byte damaged in memory after the digest was computed (so the file's sha256 in
    the manifest matches the damaged file): the split hash, whose digest comes from the
    state, does not match the file, and restore refuses it."""
    st = random_state(2, (2, 3, 4, 5))
    real = store_mod.encode_checked

    def damaging(state, *, finite_checked):
        buf, digest = real(state, finite_checked=finite_checked)
        raw = bytearray(buf.to_pybytes())
        raw[bytes(raw).find(state.S.tobytes()) + 17] ^= 0x10
        return pa.py_buffer(bytes(raw)), digest

    monkeypatch.setattr(store_mod, "encode_checked", damaging)
    store, info = _commit(tmp_path, st)
    monkeypatch.undo()
    with open(info.data_path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == _manifest(info)["sha256"]
    with pytest.raises(CorruptCheckpointError, match="sha256") as exc:
        store.restore(st.seq_id, fingerprint=FP)
    assert exc.value.path == info.data_path
    assert store.verify()[0].path == info.data_path


@pytest.mark.parametrize(
    "ranges",
    [[0, 1, 2, 3], [-1, 480, 500, 96], "x", [1, 2, 3], [True, 480, 500, 96]],
    ids=["sizes", "negative", "type", "length", "bool"],
)
def test_forged_tensor_ranges_are_refused(tmp_path, ranges):
    st = random_state(3)
    _store, info = _commit(tmp_path, st)
    m = _manifest(info)
    m["tensor_ranges"] = ranges
    with open(info.manifest_path, "w") as f:
        json.dump(m, f)
    with pytest.raises(CorruptCheckpointError, match="tensor_ranges"):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)


def test_shifted_tensor_ranges_fail_the_split_hash(tmp_path):
    st = random_state(4)
    _store, info = _commit(tmp_path, st)
    m = _manifest(info)
    s_off, s_len, z_off, z_len = m["tensor_ranges"]
    m["tensor_ranges"] = [s_off - 8, s_len, z_off, z_len]
    with open(info.manifest_path, "w") as f:
        json.dump(reseal_manifest(m), f)
    with pytest.raises(CorruptCheckpointError, match="split hash"):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)


def test_split_hash_without_ranges_is_refused(tmp_path):
    st = random_state(5)
    _store, info = _commit(tmp_path, st)
    m = _manifest(info)
    del m["tensor_ranges"]
    with open(info.manifest_path, "w") as f:
        json.dump(reseal_manifest(m), f)
    with pytest.raises(CorruptCheckpointError, match="tensor_ranges"):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)


def test_format_1_manifest_without_split_hash_still_restores(tmp_path):
    st = random_state(6)
    write_raw_commit(str(tmp_path), st.seq_id, st.position, encode_state(st), digest="x")
    with pytest.raises(CorruptCheckpointError, match="disagree"):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)
    data = encode_state(st)
    digest = state_digest(st.seq_id, st.position, st.next_chunk, FP, st.S, st.z)
    write_raw_commit(
        str(tmp_path), st.seq_id, st.position, data, digest=digest, next_chunk=st.next_chunk
    )
    assert CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP) == st


def test_without_split_hash_a_hash_mismatch_is_reported_before_arrow_errors(tmp_path):
    """The legacy path hashes in a thread while decoding: the order of the reports holds."""
    st = random_state(7)
    data = encode_state(st)
    _, dpath = write_raw_commit(str(tmp_path), st.seq_id, st.position, data)
    store = CheckpointStore(str(tmp_path))
    for off in range(0, 400, 3):  # magic, schema message, record batch metadata
        flip_bit(dpath, off, off % 8)
        with pytest.raises(CorruptCheckpointError) as exc:
            store.restore(st.seq_id, fingerprint=FP)
        assert exc.value.reason.startswith("sha256"), (off, exc.value.reason)
        flip_bit(dpath, off, off % 8)


@settings(max_examples=25, deadline=None)
@given(
    seed=hst.integers(0, 2**32 - 1),
    dtype=hst.sampled_from(["float64", "float32"]),
    seq_len=hst.integers(0, 40),
)
def test_tensor_ranges_locate_the_tensors(seed, dtype, seq_len):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 5, size=4))
    st = random_state(seed, shape, seq_id="s" * seq_len, dtype=dtype)
    buf, digest = codec_mod.encode_checked(st, finite_checked=False)
    ranges = tensor_ranges(buf, st)
    assert ranges is not None
    s_off, s_len, z_off, z_len = ranges
    raw = buf.to_pybytes()
    assert raw[s_off : s_off + s_len] == st.S.tobytes()
    assert raw[z_off : z_off + z_len] == st.z.tobytes()
    assert digest == digest_of_bytes(
        st.seq_id,
        st.position,
        st.next_chunk,
        st.fingerprint,
        dtype,
        st.state_shape,
        raw[s_off : s_off + s_len],
        raw[z_off : z_off + z_len],
    )


def test_digest_hint_is_used_only_for_the_bytes_it_covers():
    st = random_state(8)
    data = encode_state(st)
    fields = (st.seq_id, st.position, st.next_chunk, st.fingerprint, "float64", st.state_shape)
    wrong = "sha256:" + "0" * 64
    # a hint for other memory is ignored: the digest is computed, the state decodes
    other = DigestHint(1, st.S.nbytes, 2, st.z.nbytes, fields, wrong)
    assert codec_mod.decode_with_header(data, digest_hint=other)[0] == st
    # a hint for these very bytes is used, and still compared with the file's digest
    base = np.frombuffer(data, np.uint8).ctypes.data
    s_at, z_at = data.find(st.S.tobytes()), data.find(st.z.tobytes())
    here = DigestHint(base + s_at, st.S.nbytes, base + z_at, st.z.nbytes, fields, wrong)
    with pytest.raises(CorruptCheckpointError, match="digest"):
        codec_mod.decode_with_header(data, digest_hint=here)
    # ... but not for other fields
    moved = DigestHint(
        base + s_at, st.S.nbytes, base + z_at, st.z.nbytes, ("x", *fields[1:]), wrong
    )
    assert decode_state(data) == codec_mod.decode_with_header(data, digest_hint=moved)[0]


def test_fault_paths_are_named(tmp_path):
    st = random_state(9)
    store, info = _commit(tmp_path, st)
    os.truncate(info.data_path, 10)
    with pytest.raises(CorruptCheckpointError, match="truncated") as exc:
        store.restore(st.seq_id, fingerprint=FP)
    assert exc.value.path == info.data_path
