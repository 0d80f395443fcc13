"""A job never continues a sequence history that another job on the same store advanced.

Drives the stage without a runner (in-memory state cells), so the idle timer can be fired at a
chosen moment.
"""

from __future__ import annotations

import os

import numpy as np
from helpers.stage_runs import StageRun
from linstream.pipeline import CausalLinearAttention
from linstream.pipeline.elements import Chunk, ChunkResult, DeadLetter
from linstream.state import CheckpointStore


class _Key:
    """One job's stage with one sequence "s", whose idle timer fires when the test says."""

    def __init__(self, checkpoint_dir: str, **kw) -> None:
        attention = CausalLinearAttention(
            backend="numpy", checkpoint_dir=checkpoint_dir, checkpoint_every=4, **kw
        )
        self.fingerprint = attention.step.fingerprint
        self.job = StageRun(attention)

    def send(self, index: int, data: dict) -> list:
        return self.job.send(Chunk("s", index, data))

    def idle(self) -> list:
        return self.job.idle("s")

    def close(self) -> None:
        self.job.finish()


def _data(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((2, 1, 2)) for name in "qkv"}


def test_returning_sequence_refuses_a_checkpoint_written_by_another_job(tmp_path):
    chunks = [_data(i) for i in range(12)]
    other_job = _Key(str(tmp_path))
    for i in range(12):  # commits up to next chunk 12 in the shared store
        other_job.send(i, chunks[i])
    other_job.close()

    job = _Key(str(tmp_path))  # resume off, same store: its history starts anew
    for i in range(2):
        assert all(isinstance(o, ChunkResult) for o in job.send(i, chunks[i]))
    # Its first commit would be commit 1 of the chain, which the other job holds: refused.
    dead = [o for o in job.idle() if isinstance(o, DeadLetter)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(0, "fenced"), (1, "fenced")]
    assert "another job advanced this sequence" in dead[0].message
    outputs = job.send(2, chunks[2])
    dead = [o for o in outputs if isinstance(o, DeadLetter)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(2, "fenced")]
    assert not [o for o in outputs if isinstance(o, ChunkResult)]
    # The other job's history is untouched.
    assert CheckpointStore(str(tmp_path)).restore("s", fingerprint=job.fingerprint).next_chunk == 12


def test_evicted_sequence_refuses_a_history_another_job_advanced(tmp_path):
    chunks = [_data(i) for i in range(8)]
    job = _Key(str(tmp_path))
    for i in range(2):
        job.send(i, chunks[i])
    job.idle()  # commit 1 (next chunk 2), Beam state cleared
    other = _Key(str(tmp_path), resume=True)
    for i in range(2, 6):  # continues the same history: commit 2
        other.send(i, chunks[i])
    other.idle()
    outputs = job.send(2, chunks[2])
    dead = [o for o in outputs if isinstance(o, DeadLetter)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(2, "restore_failed")]
    assert "another job advanced it" in dead[0].message


def _other_history(tmp_path, n: int) -> list[dict]:
    """Another job commits chunks 0..n-1 of "s" (other content) in the shared store."""
    other = _Key(str(tmp_path))
    for i in range(n):
        other.send(i, _data(100 + i))
    other.close()
    return [_data(i) for i in range(12)]


def _reasons(outputs) -> list[tuple[int, str]]:
    return sorted((d.chunk_index, d.reason) for d in outputs if isinstance(d, DeadLetter))


def test_chunks_waiting_in_the_buffer_of_a_fenced_sequence_are_fenced_not_a_gap(tmp_path):
    """Chunks 6 and 7 wait behind the missing chunk 4 when the commit at chunk 4 finds the
    sequence advanced by another job: they are `fenced` at once (another job has the sequence),
    not reported later as a gap that a resend could fill."""
    chunks = _other_history(tmp_path, 8)
    job = _Key(str(tmp_path))
    assert job.send(6, chunks[6]) == [] and job.send(7, chunks[7]) == []
    for i in range(3):
        job.send(i, chunks[i])
    fenced = job.send(3, chunks[3])  # applied; the commit of chunks 0..3 is refused
    assert _reasons(fenced) == [(i, "fenced") for i in (0, 1, 2, 3, 6, 7)]
    messages = [d.message for d in fenced if isinstance(d, DeadLetter)]
    assert all("another job advanced this sequence" in m for m in messages)
    assert job.idle() == []  # nothing is left to report as a gap
    job.close()


def test_chunks_buffered_when_the_idle_commit_is_fenced_are_fenced(tmp_path):
    chunks = _other_history(tmp_path, 4)
    job = _Key(str(tmp_path))
    job.send(0, chunks[0])
    job.send(1, chunks[1])
    assert job.send(3, chunks[3]) == []  # waits for chunk 2
    dead = job.idle()  # the commit of chunks 0..1 is refused: all three are fenced
    assert _reasons(dead) == [(0, "fenced"), (1, "fenced"), (3, "fenced")]
    assert "waited for chunk" not in " ".join(d.message for d in dead)
    job.close()


def test_a_twins_equal_commit_removed_before_it_is_read_back_fences_the_sequence(
    tmp_path, monkeypatch
):
    """Two jobs on one store make the same commit 1; the second finds it there (a duplicate)
    and reads it back, but the twin's clean-up (retention, after it moved on) has removed it by
    then.  The sequence is the twin's: this job's chunks are `fenced`, the job does not fail
    with "manifest disappeared"."""
    chunks = [_data(i) for i in range(6)]
    twin = _Key(str(tmp_path))
    for i in range(4):  # commit 1 (chunks 0..3)
        twin.send(i, chunks[i])
    twin.close()
    job = _Key(str(tmp_path))
    store = job.job.stage._commits.store
    real = type(store).read_chain

    def removed_first(self, seq_id, commit, **kw):
        for info in self.commits(seq_id):
            if info.commit == commit:
                os.remove(info.manifest_path)
        return real(self, seq_id, commit, **kw)

    monkeypatch.setattr(type(store), "read_chain", removed_first)
    for i in range(3):
        assert all(isinstance(o, ChunkResult) for o in job.send(i, chunks[i]))
    outputs = job.send(3, chunks[3])  # its commit 1 is a duplicate of the twin's
    assert _reasons(outputs) == [(i, "fenced") for i in range(4)]
    messages = [d.message for d in outputs if isinstance(d, DeadLetter)]
    assert all("another job advanced this sequence" in m for m in messages), messages
    dead = [o for o in job.send(4, chunks[4]) if isinstance(o, DeadLetter)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(4, "fenced")]
    job.close()
