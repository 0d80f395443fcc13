"""A writer removes only files it owns: a commit that loses (another history took its number)
never removes a file that a commit of the winner names, even when both committed the very same
state at the same position; retention removes files by what the chain says, not by position."""

import dataclasses
import uuid

import pytest
from helpers.store_faults import random_state
from linstream.state import CheckpointStore, History, SupersededError

FP = "f" * 64


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "ckpt")
    return f"memory://linstream-test-{uuid.uuid4().hex}"


def _at(st, position, next_chunk):
    return dataclasses.replace(st, position=position, next_chunk=next_chunk)


def test_a_fenced_writer_leaves_the_winners_identical_data_file(root):
    base = random_state(1, seq_id="s", position=4, next_chunk=1)
    same = _at(random_state(2, seq_id="s"), 12, 3)  # the state both writers reach
    winner = CheckpointStore(root, background_prune=False)
    winner.commit(base, History(1, 0, -1, b""))
    winner.commit(_at(random_state(3, seq_id="s"), 8, 2), History(2, 4, -1, b""))
    winner.commit(same, History(3, 8, -1, b""))
    # The late writer continued commit 1 with the same chunks in one step: same state, same
    # position as the winner's commit 3, but commit number 2 (taken by another history).
    late = CheckpointStore(root, background_prune=False)
    with pytest.raises(SupersededError):
        late.commit(same, History(2, 4, -1, b""))
    assert winner.verify() == []
    assert winner.orphans() == []
    assert winner.restore("s", fingerprint=FP) == same


def test_retention_keeps_every_file_a_kept_commit_names(root):
    st = random_state(4, seq_id="s", position=1, next_chunk=1)
    store = CheckpointStore(root, background_prune=False)
    states = [_at(st, p, p) for p in (1, 2, 3, 4)]
    for n, s in enumerate(states, start=1):
        store.commit(s, History(n, 0 if n == 1 else n - 1, -1, b""))
    assert [(c.commit, c.position) for c in store.commits("s")] == [(4, 4), (3, 3)]
    assert store.verify() == [] and store.orphans() == []
    assert store.restore("s", fingerprint=FP) == states[-1]
