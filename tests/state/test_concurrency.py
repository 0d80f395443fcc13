"""Eight processes (spawned, released together by a barrier) commit the same position."""

import dataclasses

import pytest
from helpers.store_faults import CommitWorkers, random_state
from linstream.state import CheckpointStore, encode_state

FP = "f" * 64
N = 8


@pytest.fixture(scope="module")
def workers():
    with CommitWorkers(N) as w:
        yield w


def test_same_state_from_8_processes_makes_one_commit(tmp_path, workers):
    st = random_state(1)
    outcomes = workers.commit_all(str(tmp_path), [encode_state(st)] * N)
    assert sorted(outcomes) == ["committed"] + ["duplicate"] * (N - 1), outcomes
    store = CheckpointStore(str(tmp_path))
    assert [c.position for c in store.commits(st.seq_id)] == [st.position]
    assert store.orphans() == []
    assert store.verify() == []
    assert store.restore(st.seq_id, fingerprint=FP) == st


def test_different_states_from_8_processes_exactly_one_wins(tmp_path, workers):
    base = random_state(2)
    states = [dataclasses.replace(base, S=base.S + i) for i in range(N)]
    outcomes = workers.commit_all(str(tmp_path), [encode_state(s) for s in states])
    winners = [i for i, o in enumerate(outcomes) if o == "committed"]
    assert len(winners) == 1, outcomes
    losers = [o for i, o in enumerate(outcomes) if i not in winners]
    assert all(o.startswith("DivergentStateError") for o in losers), outcomes
    store = CheckpointStore(str(tmp_path))
    assert store.restore(base.seq_id, fingerprint=FP) == states[winners[0]]
    assert store.orphans() == []  # each loser removed its own data file
    assert store.verify() == []
