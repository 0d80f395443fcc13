"""Another job's retention removes a commit while this one uses it (object stores make the
window wide): the store reads the sequence again, or refuses this writer as superseded (the
history moved on); it never reports the vanished commit as corrupt, and leaves no orphan."""

import dataclasses
import uuid

import pytest
from helpers.store_faults import random_state
from linstream.state import CheckpointStore, History, SupersededError
from linstream.state.store.restore import Restorer

FP = "f" * 64


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "ckpt")
    return f"memory://linstream-test-{uuid.uuid4().hex}"


def _chain(store, n):
    st = random_state(7, seq_id="s", position=1, next_chunk=1)
    states = [dataclasses.replace(st, position=p, next_chunk=p) for p in range(1, n + 1)]
    for i, s in enumerate(states, start=1):
        store.commit(s, History(i, 0 if i == 1 else i - 1, -1, b""))
    return states


def _at(states, position):
    """The chain's state moved to ``position`` (a later commit of the same sequence)."""
    return dataclasses.replace(states[0], position=position, next_chunk=position)


def test_head_reads_again_when_the_commit_it_reads_is_removed(root, monkeypatch):
    store = CheckpointStore(root, background_prune=False)
    states = _chain(store, 2)
    other = CheckpointStore(root, background_prune=False)
    real = Restorer.load_file
    fired = []

    def load_then_advance(self, path, *args, **kwargs):
        if not fired:  # the other job commits twice and prunes the commit being read
            fired.append(path)
            other.commit(_at(states, 3), History(3, 2, -1, b""))
            other.commit(_at(states, 4), History(4, 3, -1, b""))
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(Restorer, "load_file", load_then_advance)
    head = store.head("s", fingerprint=FP)
    assert fired and head is not None and head.state.position == 4


def test_a_duplicate_whose_commit_was_pruned_is_superseded(root):
    store = CheckpointStore(root, background_prune=False)
    _chain(store, 4)  # commits 1 and 2 are pruned
    with pytest.raises(SupersededError, match="moved on to commit 4"):
        store.read_chain("s", 2, fingerprint=FP)


def test_a_commit_taken_then_pruned_meanwhile_is_superseded_without_an_orphan(root, monkeypatch):
    store = CheckpointStore(root, background_prune=False)
    states = _chain(store, 2)
    late = CheckpointStore(root, background_prune=False)
    real = late.folders.read_manifest_if_any
    calls = []

    def others_move(mpath, position):
        calls.append(mpath)
        if len(calls) == 1:  # before the create: the other job takes commit 3 ...
            store.commit(_at(states, 3), History(3, 2, -1, b""))
        elif len(calls) == 2:  # ... and after it failed, moves on and prunes commit 3
            store.commit(_at(states, 4), History(4, 3, -1, b""))
            store.commit(_at(states, 5), History(5, 4, -1, b""))
        return None if len(calls) == 1 else real(mpath, position)

    monkeypatch.setattr(late.folders, "read_manifest_if_any", others_move)
    other_state = dataclasses.replace(random_state(8, seq_id="s"), position=3, next_chunk=3)
    with pytest.raises(SupersededError, match="moved on to commit 5"):
        late.commit(other_state, History(3, 2, -1, b""))
    monkeypatch.undo()
    assert store.orphans() == [] and store.verify() == []
    assert store.restore("s", fingerprint=FP) == _at(states, 5)


def test_a_duplicate_whose_commit_is_pruned_before_its_data_is_checked_leaves_no_orphan(
    root, monkeypatch
):
    """A twin job meets the same commit (a duplicate) and checks its data file just after the
    other job's retention removed the commit: it must not write the file back as a repair."""
    store = CheckpointStore(root, background_prune=False)
    states = _chain(store, 2)

    store.commit(_at(states, 3), History(3, 2, -1, b""))
    late = CheckpointStore(root, background_prune=False)
    real = late.folders.fs.read
    fired = []

    def read_after_prune(path, limit):
        if path.endswith(".arrow") and not fired:  # between its manifest and its data file
            fired.append(path)
            store.commit(_at(states, 4), History(4, 3, -1, b""))
            store.commit(_at(states, 5), History(5, 4, -1, b""))  # retention removes commit 3
        return real(path, limit)

    monkeypatch.setattr(late.folders.fs, "read", read_after_prune)
    with pytest.raises(SupersededError, match="moved on to commit 5"):
        late.commit(_at(states, 3), History(3, 2, -1, b""))
    monkeypatch.undo()
    assert fired
    assert store.orphans() == [] and store.verify() == []
    assert store.restore("s", fingerprint=FP) == _at(states, 5)
