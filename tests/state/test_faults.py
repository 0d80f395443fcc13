"""The fault matrix: every damaged, missing, foreign or newer checkpoint is refused with a named
error that says which file and why, and `verify` finds each one."""

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pytest
from helpers.store_faults import (
    flip_bit,
    random_state,
    rewrite_state_file,
    truncate,
    write_raw_commit,
)
from linstream.state import (
    CheckpointStore,
    CorruptCheckpointError,
    ModelMismatchError,
    UnsupportedFormatVersionError,
    encode_state,
)

FP = "f" * 64


def _committed(tmp_path, seed=0, seq_id="seq", dtype="float64"):
    store = CheckpointStore(str(tmp_path))
    st = random_state(seed, seq_id=seq_id, dtype=dtype)
    store.commit(st)
    return store, st, store.commits(seq_id)[0]


def _size(path):
    return os.path.getsize(path)


# --- each fault, one at a time --------------------------------------------------------------


def _truncate_to(cut):
    def plant(info):
        n = _size(info.data_path)
        truncate(info.data_path, {"half": n // 2, "size-1": n - 1}.get(cut, cut))
        return info.data_path

    return plant


def _remove_data(info):
    os.unlink(info.data_path)
    return info.data_path


def _empty_manifest(info):
    truncate(info.manifest_path, 0)
    return info.manifest_path


def _half_manifest(info):
    truncate(info.manifest_path, _size(info.manifest_path) // 2)
    return info.manifest_path


def _flip_data(offset_fraction, bit=0):
    def plant(info):
        flip_bit(info.data_path, int(_size(info.data_path) * offset_fraction), bit)
        return info.data_path

    return plant


FAULTS = {
    "truncated-0": (_truncate_to(0), CorruptCheckpointError, "truncated"),
    "truncated-8": (_truncate_to(8), CorruptCheckpointError, "truncated"),
    "truncated-half": (_truncate_to("half"), CorruptCheckpointError, "truncated"),
    "truncated-size-1": (_truncate_to("size-1"), CorruptCheckpointError, "truncated"),
    "data-missing": (_remove_data, CorruptCheckpointError, "missing"),
    "manifest-empty": (_empty_manifest, CorruptCheckpointError, "empty"),
    "manifest-half": (_half_manifest, CorruptCheckpointError, "not complete JSON"),
    "bit-flip-head": (_flip_data(0.05, 3), CorruptCheckpointError, "sha256"),
    "bit-flip-middle": (_flip_data(0.5, 7), CorruptCheckpointError, "sha256"),
    "bit-flip-tail": (_flip_data(0.99, 0), CorruptCheckpointError, "sha256"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_refused_naming_the_file(tmp_path, fault):
    plant, error, match = FAULTS[fault]
    store, st, info = _committed(tmp_path)
    path = plant(info)
    with pytest.raises(error, match=match) as exc:
        store.restore(st.seq_id, fingerprint=FP)
    assert exc.value.path == path.replace(os.sep, "/")
    assert path.replace(os.sep, "/") in str(exc.value)


def test_every_byte_of_the_data_file_is_covered(tmp_path):
    """Bit flips swept across the whole file (header, tensors, footer): each one detected."""
    store, st, info = _committed(tmp_path, dtype="float32")
    n = _size(info.data_path)
    for off in range(n):
        bit = off % 8
        flip_bit(info.data_path, off, bit)
        with pytest.raises(CorruptCheckpointError):
            store.restore(st.seq_id, fingerprint=FP)
        flip_bit(info.data_path, off, bit)
    assert store.restore(st.seq_id, fingerprint=FP) == st


def test_tensor_bit_flips_behind_a_consistent_manifest_hit_the_digest(tmp_path):
    """Damage that happened before the manifest hashed the file (e.g. in memory): the content
    digest still catches it, in every tensor byte."""
    st = random_state(1, (2, 2, 3, 4))
    data = encode_state(st)
    raw_s = st.S.tobytes() + st.z.tobytes()
    start = data.find(st.S.tobytes())
    store = CheckpointStore(str(tmp_path))
    step = 7  # a prime stride over S and z bytes keeps this fast and covers every bit position
    for off in range(start, start + len(raw_s), step):
        damaged = bytearray(data)
        damaged[off] ^= 1 << (off % 8)
        write_raw_commit(str(tmp_path), st.seq_id, st.position, bytes(damaged))
        with pytest.raises(CorruptCheckpointError, match="digest"):
            store.restore(st.seq_id, fingerprint=FP)


def test_newer_format_version_names_both_versions(tmp_path):
    st = random_state(2)
    data = rewrite_state_file(
        encode_state(st), metadata={"format_version": "4", "min_reader_version": "4"}
    )
    mpath, _ = write_raw_commit(
        str(tmp_path), st.seq_id, st.position, data, format_version=4, min_reader_version=4
    )
    store = CheckpointStore(str(tmp_path))
    with pytest.raises(UnsupportedFormatVersionError, match=r"format version 4.*1 to 3") as exc:
        store.restore(st.seq_id, fingerprint=FP)
    assert exc.value.path == mpath  # refused from the manifest, before reading the data
    # a newer data file behind an old-looking manifest is refused too, naming the data file
    _, dpath = write_raw_commit(str(tmp_path), st.seq_id, st.position, data)
    with pytest.raises(UnsupportedFormatVersionError, match="version 4") as exc:
        store.restore(st.seq_id, fingerprint=FP)
    assert exc.value.path == dpath


def test_other_models_fingerprint(tmp_path):
    store, st, info = _committed(tmp_path)
    with pytest.raises(ModelMismatchError, match="another model") as exc:
        store.restore(st.seq_id, fingerprint="0" * 64)
    assert exc.value.path == info.data_path


@pytest.mark.parametrize(
    ("forge", "manifest", "match"),
    [
        (
            lambda st: {"columns": {"z": _tensor(np.zeros((2, 2, 4)))}},
            {},
            "shapes",
        ),
        (
            lambda st: {"columns": {"S": _tensor(st.S.astype(np.float32))}},
            {},
            "state dtype",
        ),
        (
            lambda st: {"metadata": {"state_dtype": "float32"}},
            {},
            "state dtype float32",
        ),
        (lambda st: {}, {"shape": (2, 2, 3, 5)}, "disagree"),
        (lambda st: {}, {"dtype": "float32"}, "disagree"),
        (lambda st: {}, {"seq_id": "other"}, "disagree"),
        (lambda st: {}, {"next_chunk": 99}, "next chunk"),
    ],
    ids=[
        "z-shape",
        "S-dtype",
        "dtype-meta",
        "manifest-shape",
        "manifest-dtype",
        "manifest-seq",
        "manifest-chunk",
    ],
)
def test_wrong_shape_dtype_or_identity(tmp_path, forge, manifest, match):
    st = random_state(3)
    data = rewrite_state_file(encode_state(st), **forge(st))
    fields = {"digest": _digest(encode_state(st))} | manifest
    write_raw_commit(str(tmp_path), st.seq_id, st.position, data, **fields)
    with pytest.raises(CorruptCheckpointError, match=match):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)


def _tensor(a):
    return pa.FixedShapeTensorArray.from_numpy_ndarray(a.reshape(1, *a.shape))


def _digest(data):
    meta = pa.ipc.open_file(pa.py_buffer(data)).schema.metadata
    return meta[b"linstream.digest"].decode()


def test_non_finite_written_by_a_foreign_writer_is_refused(tmp_path):
    st = random_state(4)
    S = st.S.copy()
    S[0, 0, 0, 0] = np.inf
    from linstream.state.codec import state_digest

    digest = state_digest(st.seq_id, st.position, st.next_chunk, st.fingerprint, S, st.z)
    data = rewrite_state_file(
        encode_state(st), metadata={"digest": digest}, columns={"S": _tensor(S)}
    )
    write_raw_commit(str(tmp_path), st.seq_id, st.position, data, digest=digest)
    with pytest.raises(CorruptCheckpointError, match="finite"):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)


def test_manifest_cannot_point_outside_its_folder(tmp_path):
    st = random_state(5)
    mpath, _ = write_raw_commit(str(tmp_path), st.seq_id, st.position, encode_state(st))
    with open(mpath) as f:
        text = f.read()
    name = text.split('"data_file": "')[1].split('"')[0]
    with open(mpath, "w") as f:
        f.write(text.replace(name, "../../../etc/passwd"))
    with pytest.raises(CorruptCheckpointError, match="data_file"):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)


def test_oversized_manifest_is_not_read_whole(tmp_path):
    st = random_state(6)
    mpath, _ = write_raw_commit(str(tmp_path), st.seq_id, st.position, encode_state(st))
    with open(mpath, "ab") as f:
        f.write(b" " * (1 << 20))
    with pytest.raises(CorruptCheckpointError, match="larger than"):
        CheckpointStore(str(tmp_path)).restore(st.seq_id, fingerprint=FP)


# --- verify finds every planted fault at once ------------------------------------------------


def test_verify_finds_every_planted_fault(tmp_path):
    store = CheckpointStore(str(tmp_path))
    planted = {}
    for i, (name, (plant, error, _match)) in enumerate(FAULTS.items()):
        st = random_state(i, seq_id=f"faulty-{name}")
        store.commit(st)
        # a healthy older commit in the same sequence must not be reported
        store.commit(dataclasses.replace(st, position=st.position + 1, next_chunk=2))
        planted[plant(store.commits(st.seq_id)[0]).replace(os.sep, "/")] = error.__name__
    st = random_state(99, seq_id="newer-format")
    data = rewrite_state_file(
        encode_state(st), metadata={"format_version": "4", "min_reader_version": "4"}
    )
    mpath, _ = write_raw_commit(
        str(tmp_path), st.seq_id, st.position, data, format_version=4, min_reader_version=4
    )
    planted[mpath] = "UnsupportedFormatVersionError"
    for i in range(3):
        store.commit(random_state(100 + i, seq_id=f"healthy-{i}"))

    problems = store.verify()
    found = {p.path: p.error for p in problems}
    assert found == planted
    assert all(p.reason for p in problems)
