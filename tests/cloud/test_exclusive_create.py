"""Create-if-absent on the real servers: 8 racing committers, exactly one wins; a filesystem or
server without a real condition is refused, never used."""

from __future__ import annotations

import dataclasses
import threading
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from helpers.store_faults import CommitWorkers, random_state
from linstream.state import CheckpointStore, encode_state
from linstream.state.store.filesystems import (
    FsspecStorage,
    UnsafeStorageError,
    open_storage,
)

N = 8
FP = "f" * 64


@pytest.fixture(scope="module")
def workers(s3_store, gcs_store):
    # Spawned after both servers' variables are set, so the workers reach both.
    with CommitWorkers(N) as w:
        yield w


def test_eight_threads_create_one_object_exactly_one_wins(object_store):
    storage = FsspecStorage(object_store.url(f"race-{uuid.uuid4().hex[:8]}"))
    path = storage.join("one.manifest.json")
    barrier = threading.Barrier(N)
    won: list[int] = []

    def attempt(i: int) -> None:
        barrier.wait(timeout=30)
        if storage.create_exclusive(path, f"writer {i}".encode()):
            won.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(won) == 1, won
    assert storage.read(path, 100) == f"writer {won[0]}".encode()


def test_eight_processes_commit_one_position_exactly_one_wins(object_store, workers):
    root = object_store.url(f"race-{uuid.uuid4().hex[:8]}")
    base = random_state(4)
    states = [dataclasses.replace(base, S=base.S + i) for i in range(N)]
    outcomes = workers.commit_all(root, [encode_state(s) for s in states])
    winners = [i for i, o in enumerate(outcomes) if o == "committed"]
    assert len(winners) == 1, outcomes
    assert all(
        o.startswith("DivergentStateError") for i, o in enumerate(outcomes) if i != winners[0]
    )
    store = CheckpointStore(root)
    assert store.restore(base.seq_id, fingerprint=FP) == states[winners[0]]
    assert store.verify() == []


def test_a_server_that_ignores_the_condition_is_refused(object_store, monkeypatch):
    storage = FsspecStorage(object_store.url(f"ignored-{uuid.uuid4().hex[:8]}"))
    real = storage.fs.pipe_file

    def unconditional(path, value, mode="overwrite", **kw):  # what a lax server does
        return real(path, value, **kw)

    monkeypatch.setattr(storage.fs, "pipe_file", unconditional)
    with pytest.raises(UnsafeStorageError, match="accepted a second create-if-absent"):
        storage.create_exclusive(storage.join("m.json"), b"x")
    assert not storage.fs.exists(storage.join("m.json"))


class _NoExclusiveFS(MemoryFileSystem):
    """A filesystem whose mode "xb" is fsspec's default: accepted, then overwrites."""

    protocol = "laxfs"
    store: dict = {}  # noqa: RUF012 - fsspec's class-level store
    pseudo_dirs = [""]  # noqa: RUF012


def test_a_filesystem_without_known_create_if_absent_is_refused():
    fsspec.register_implementation("laxfs", _NoExclusiveFS, clobber=True)
    with pytest.raises(UnsafeStorageError) as err:
        open_storage("laxfs://bucket/ckpt")
    text = str(err.value)
    assert "laxfs://bucket/ckpt" in text and "no known atomic create-if-absent" in text
    assert "gs://" in text and "s3://" in text
