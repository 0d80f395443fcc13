"""A job never continues a sequence history that another job on the same store advanced.

Drives the stage without a runner (in-memory state cells), so the idle timer can be fired at a
chosen moment.
"""

from __future__ import annotations

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
