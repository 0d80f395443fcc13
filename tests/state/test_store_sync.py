"""Batched folder fsyncs (``CheckpointStore(sync_batch=N)``, local disk): a commit's files are
fsynced before its name exists, as always; the fsync of its folder, which makes the name
durable, waits for ``sync()`` (at the latest when N commits wait), and so does retention.
Judged from the fsync calls the process makes (the paths of their descriptors) and the files
on disk."""

from __future__ import annotations

import dataclasses
import os

import pytest
from helpers.store_faults import random_state
from linstream.state import CheckpointStore
from linstream.state.store.paths import encode_seq_dir

FP = "f" * 64


@pytest.fixture
def fsynced(monkeypatch):
    """Every path the process fsyncs from now on, in order."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to name a descriptor's path")
    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _states(seq_id, n):
    st = random_state(3, seq_id=seq_id)
    return [
        dataclasses.replace(st, position=st.position + i, next_chunk=st.next_chunk + i)
        for i in range(n)
    ]


def _commit_names(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".commit.json"))


def test_folders_are_synced_by_sync_and_retention_waits_for_it(tmp_path, fsynced):
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root), keep=2, sync_batch=64, background_prune=False)
    for st in _states("a", 3) + _states("b", 1):
        assert store.commit(st) == "committed"
    a, b = (root / encode_seq_dir(s) for s in "ab")
    # Each commit's data and manifest were fsynced (as files, before their names existed),
    # no folder yet.
    assert len(fsynced) == 2 * 4
    assert not [p for p in fsynced if os.path.isdir(p)]
    assert len(_commit_names(a)) == 3  # retention waits too

    store.sync()
    synced = [p for p in fsynced if os.path.isdir(p)]
    assert sorted(synced) == sorted(map(str, [tmp_path, root, a, b]))
    assert _commit_names(a) == [
        "00000000000000000002.commit.json",
        "00000000000000000003.commit.json",
    ]  # commit 1 went only after commit 3's folder was durable
    assert store.restore("a", fingerprint=FP) == _states("a", 3)[-1]
    fsynced.clear()
    store.sync()  # nothing waits: nothing is synced again
    assert fsynced == []


def test_sync_happens_by_itself_once_the_batch_is_full(tmp_path, fsynced):
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root), sync_batch=2)
    store.commit(_states("a", 1)[0])
    assert not [p for p in fsynced if os.path.isdir(p)]
    store.commit(_states("b", 1)[0])
    synced = [p for p in fsynced if os.path.isdir(p)]
    assert sorted(synced) == sorted(map(str, [tmp_path, root, *root.iterdir()]))
    store.close()


def test_without_a_batch_each_commit_syncs_its_folder(tmp_path, fsynced):
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root))
    store.commit(_states("a", 1)[0])
    folder = next(p for p in root.iterdir() if p.is_dir())
    assert str(folder) in fsynced and str(root) in fsynced
    store.close()
