"""CheckpointStore: commit outcomes, restore, retention, fallback, orphans and gc, on local
disk and memory://."""

import dataclasses
import hashlib
import itertools
import logging
import os
import uuid

import numpy as np
import pytest
from helpers.store_faults import flip_bit, random_state, truncate
from hypothesis import given, settings
from hypothesis import strategies as hst
from linstream.state import (
    CheckpointStore,
    CommitOutcome,
    CorruptCheckpointError,
    DivergentStateError,
    ModelMismatchError,
    NonFiniteStateError,
    SequenceState,
    SupersededError,
    encode_state,
)
from linstream.state.store.paths import decode_seq_dir, encode_seq_dir

FP = "f" * 64


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "ckpt")
    return f"memory://linstream-test-{uuid.uuid4().hex}"


def test_restore_of_unknown_sequence_is_none(root):
    assert CheckpointStore(root).restore("nobody", fingerprint=FP) is None


def test_commit_then_restore_is_bit_exact(root):
    store = CheckpointStore(root)
    for dtype in ("float64", "float32"):
        st = random_state(1, seq_id=f"s-{dtype}", dtype=dtype)
        assert store.commit(st) == CommitOutcome.COMMITTED
        back = store.restore(st.seq_id, fingerprint=FP)
        assert back == st
    assert store.sequences() == ["s-float32", "s-float64"]


def test_same_state_again_is_duplicate(root):
    store = CheckpointStore(root)
    st = random_state(2)
    assert store.commit(st) == "committed"
    assert store.commit(st) == "duplicate"
    assert CheckpointStore(root).commit(st) == "duplicate"  # another worker
    assert store.counters["duplicate"] == 1


def test_state_equal_within_tolerance_keeps_the_first(root, caplog):
    store = CheckpointStore(root)
    first = random_state(3)
    retried = dataclasses.replace(first, S=first.S * (1 + 3e-12), z=np.nextafter(first.z, 9))
    assert store.commit(first) == "committed"
    with caplog.at_level(logging.INFO, logger="linstream.state"):
        assert store.commit(retried) == "equal_within_tolerance"
    assert "equal within tolerance" in caplog.text
    assert store.restore(first.seq_id, fingerprint=FP) == first
    assert store.counters["equal_within_tolerance"] == 1
    assert store.orphans() == []  # the retry's own data file was removed


@pytest.mark.parametrize(
    "change",
    [
        lambda st: {"S": st.S * 1.01},
        lambda st: {"z": st.z + 1.0},
        lambda st: {"next_chunk": st.next_chunk + 1},
        lambda st: {"fingerprint": "e" * 64},
    ],
    ids=["S", "z", "next_chunk", "model"],
)
def test_different_state_at_same_position_raises(root, change):
    store = CheckpointStore(root)
    st = random_state(4)
    store.commit(st)
    other = dataclasses.replace(st, **change(st))
    with pytest.raises(DivergentStateError, match=f"position {st.position}"):
        store.commit(other)
    assert store.restore(st.seq_id, fingerprint=FP) == st
    assert store.orphans() == []  # the loser removed its data file


def test_non_finite_refuses_to_commit_and_writes_nothing(root):
    store = CheckpointStore(root)
    st = random_state(5)
    for bad in (np.nan, np.inf):
        z = st.z.copy()
        z[0, 0, 0] = bad
        with pytest.raises(NonFiniteStateError, match="refusing to commit"):
            store.commit(dataclasses.replace(st, z=z))
    assert store.sequences() == []


@pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])
def test_retention_keeps_the_newest(root, background):
    store = CheckpointStore(root, keep=3, background_prune=background)
    st = random_state(6)
    for i in range(1, 11):
        store.commit(dataclasses.replace(st, position=10 * i, next_chunk=i))
        store.flush()
        kept = [c.position for c in store.commits(st.seq_id)]
        assert kept == [10 * j for j in range(i, max(0, i - 3), -1)]
    files = store.folders.fs.list_dir(store.folders.seq_dir(st.seq_id))
    assert len(files) == 6  # 3 manifests + 3 data files, nothing else
    assert store.restore(st.seq_id, fingerprint=FP).position == 100


def test_keep_below_two_is_refused(tmp_path):
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(str(tmp_path), keep=1)


def test_other_model_is_refused_on_restore(root):
    store = CheckpointStore(root)
    store.commit(random_state(7))
    with pytest.raises(ModelMismatchError, match="another model"):
        store.restore("seq", fingerprint="0" * 64)


def test_fallback_is_explicit_and_logged(tmp_path, caplog):
    store = CheckpointStore(str(tmp_path))
    st = random_state(8)
    store.commit(st)
    newer = dataclasses.replace(st, position=st.position + 5, next_chunk=st.next_chunk + 1)
    store.commit(newer)
    truncate(store.commits(st.seq_id)[0].data_path, 100)
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        store.restore(st.seq_id, fingerprint=FP)
    with caplog.at_level(logging.WARNING, logger="linstream.state"):
        assert store.restore(st.seq_id, fingerprint=FP, fallback=True) == st
    assert "falling back" in caplog.text
    assert store.counters["fallbacks"] == 1
    truncate(store.commits(st.seq_id)[1].data_path, 0)
    with pytest.raises(CorruptCheckpointError):  # nothing readable left: never a silent None
        store.restore(st.seq_id, fingerprint=FP, fallback=True)


class Crash(Exception):
    pass


def test_crash_between_data_file_and_manifest(root, monkeypatch):
    now = [1_000_000.0]
    store = CheckpointStore(root, clock=lambda: now[0])
    st = random_state(9)
    store.commit(st)
    newer = dataclasses.replace(st, position=st.position + 3, next_chunk=st.next_chunk + 1)

    fs = store.folders.fs
    real = fs.commit_files

    def crash_before_manifest(data, manifest_path, prepare):
        data_path, _manifest = prepare(hashlib.sha256(data).hexdigest())
        fs.write_immutable(data_path, data)
        raise Crash

    monkeypatch.setattr(fs, "commit_files", crash_before_manifest)
    with pytest.raises(Crash):
        store.commit(newer)
    monkeypatch.setattr(fs, "commit_files", real)
    assert len(store.orphans()) == 1
    assert store.restore(st.seq_id, fingerprint=FP) == st  # the orphan is ignored
    assert store.verify() == []
    # gc keeps it during the grace period (a commit may be in flight) ...
    now[0] = (fs.mtime(store.orphans()[0]) or 0) + 10
    assert store.gc(grace_seconds=60) == []
    # ... and removes it after
    now[0] += 3600
    assert len(store.gc(grace_seconds=60)) == 1
    assert store.orphans() == []
    # the retried commit succeeds
    assert store.commit(newer) == "committed"
    assert store.restore(st.seq_id, fingerprint=FP) == newer


def test_missing_data_file_is_repaired_by_the_retried_commit(tmp_path):
    store = CheckpointStore(str(tmp_path))
    st = random_state(10)
    store.commit(st)
    os.unlink(store.commits(st.seq_id)[0].data_path)
    with pytest.raises(CorruptCheckpointError, match="missing"):
        store.restore(st.seq_id, fingerprint=FP)
    assert store.commit(st) == "duplicate"
    assert store.restore(st.seq_id, fingerprint=FP) == st


def test_stale_temporary_files_are_collected(tmp_path):
    now = [2_000_000.0]
    store = CheckpointStore(str(tmp_path), clock=lambda: now[0])
    st = random_state(11)
    store.commit(st)
    folder = os.path.join(str(tmp_path), encode_seq_dir(st.seq_id))
    tmp = os.path.join(folder, ".tmp-deadbeef")
    with open(tmp, "wb") as f:
        f.write(b"partial")
    os.utime(tmp, (now[0] - 7200, now[0] - 7200))
    assert store.gc(grace_seconds=3600) == [tmp.replace(os.sep, "/")]
    assert store.restore(st.seq_id, fingerprint=FP) == st


WEIRD_IDS = [
    "",
    ".",
    "..",
    "../../etc/passwd",
    "a/b\\c",
    "UPPER",
    "upper",
    "_5f",
    "space and\ttab\n",
    "日本語",
    "emoji 🙂",
    "x" * 300,
    "NUL\x00inside",
    "CON",
]


def test_sequence_ids_are_encoded_safely(root):
    store = CheckpointStore(root)
    names = set()
    for i, seq_id in enumerate(WEIRD_IDS):
        name = encode_seq_dir(seq_id)
        assert "/" not in name and "\\" not in name and name not in (".", "..")
        assert len(name) <= 200 and name == name.lower()
        assert decode_seq_dir(name) in (seq_id, None)
        names.add(name)
        store.commit(random_state(i, seq_id=seq_id))
    assert len(names) == len(WEIRD_IDS)
    assert store.sequences() == sorted(WEIRD_IDS)
    for i, seq_id in enumerate(WEIRD_IDS):
        assert store.restore(seq_id, fingerprint=FP) == random_state(i, seq_id=seq_id)


def test_case_folding_cannot_merge_ids():
    ids = ["".join(p) for p in itertools.product("aA_5f", repeat=3)]
    folded = {encode_seq_dir(i).lower() for i in ids}
    assert len(folded) == len(ids)


def test_a_late_retry_of_a_pruned_commit_cannot_fork_the_history(root):
    store = CheckpointStore(root)
    st = random_state(12)
    states = [dataclasses.replace(st, position=p, next_chunk=p) for p in (1, 2, 3)]
    for s in states:
        store.commit(s)
    store.flush()
    # Commit 1 was removed by retention, so its number is free: creating it again would fork
    # the history, and is undone and refused.
    with pytest.raises(SupersededError, match="moved on to commit 3"):
        store.commit(states[0])
    store.close()
    assert [(c.commit, c.position) for c in store.commits(st.seq_id)] == [(3, 3), (2, 2)]
    assert store.restore(st.seq_id, fingerprint=FP) == states[2]


def test_commit_requires_a_state(root):
    with pytest.raises(TypeError, match="SequenceState"):
        CheckpointStore(root).commit("state")  # type: ignore[arg-type]


def test_initial_state_commits(root):
    store = CheckpointStore(root)
    st = SequenceState.initial("new", (1, 2, 3, 4), FP)
    assert store.commit(st) == "committed"
    assert store.restore("new", fingerprint=FP) == st


@settings(max_examples=25, deadline=None)
@given(
    shape=hst.tuples(*[hst.integers(1, 4)] * 4),
    dtype=hst.sampled_from(["float64", "float32"]),
    seed=hst.integers(0, 2**32 - 1),
    seq_id=hst.text(max_size=20),
)
def test_store_round_trip_is_bit_exact(shape, dtype, seed, seq_id):
    store = CheckpointStore(f"memory://linstream-hyp-{uuid.uuid4().hex}")
    state = random_state(seed, shape, seq_id=seq_id, dtype=dtype)
    assert store.commit(state) == "committed"
    back = store.restore(seq_id, fingerprint=FP)
    assert back == state and back.S.tobytes() == state.S.tobytes()


def test_checks_run_in_the_documented_order(tmp_path):
    """format version before size/hash; fingerprint before identity and digest."""
    from helpers.store_faults import rewrite_state_file, write_raw_commit
    from linstream.state import UnsupportedFormatVersionError

    st0 = random_state(13)
    data = encode_state(st0)
    # newer format AND a wrong size: the version is reported
    _, dpath = write_raw_commit(
        str(tmp_path), st0.seq_id, st0.position, data, format_version=4, min_reader_version=4
    )
    truncate(dpath, 10)
    with pytest.raises(UnsupportedFormatVersionError):
        CheckpointStore(str(tmp_path)).restore(st0.seq_id, fingerprint=FP)
    # other model AND a damaged digest AND another position: the model is reported
    forged = rewrite_state_file(data, metadata={"fingerprint": "0" * 64})
    write_raw_commit(str(tmp_path), st0.seq_id, st0.position, forged)
    with pytest.raises(ModelMismatchError):
        CheckpointStore(str(tmp_path)).restore(st0.seq_id, fingerprint=FP)


def test_filesystem_without_exclusive_create_is_refused():
    from linstream.state.store.filesystems import FsspecStorage

    storage = FsspecStorage("memory://linstream-noexcl")

    class NoExclusive:
        def pipe_file(self, path, value, mode="overwrite"):
            raise NotImplementedError("File mode not supported")

    storage.fs = NoExclusive()
    with pytest.raises(OSError, match="exclusively"):
        storage.create_exclusive("/x/m.json", b"{}")


def test_damaged_data_file_is_repaired_by_the_retried_commit(tmp_path):
    store = CheckpointStore(str(tmp_path))
    st0 = random_state(14)
    store.commit(st0)
    path = store.commits(st0.seq_id)[0].data_path
    flip_bit(path, 300)
    with pytest.raises(CorruptCheckpointError, match="sha256"):
        store.restore(st0.seq_id, fingerprint=FP)
    assert store.commit(st0) == "duplicate"
    assert store.restore(st0.seq_id, fingerprint=FP) == st0
