"""A job never continues a sequence history that another job on the same store advanced.

Drives the stateful DoFn directly with in-memory stand-ins for Beam's state cells, so the idle
timer can be fired at a chosen moment.
"""

from __future__ import annotations

import numpy as np
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp
from linstream.pipeline.elements import Chunk, ChunkResult
from linstream.pipeline.stage.dofn import SequenceDoFn
from linstream.pipeline.stage.steps import RawAttentionStep


class _Cell:
    def __init__(self) -> None:
        self.value = None

    def read(self):
        return self.value

    def write(self, value) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _Bag:
    def __init__(self) -> None:
        self.items: list = []

    def read(self):
        return list(self.items)

    def add(self, item) -> None:
        self.items.append(item)

    def clear(self) -> None:
        self.items = []


class _Timer:
    def set(self, when) -> None:
        self.when = when


class _Key:
    """One sequence's Beam state, as the runner would keep it between elements."""

    def __init__(self, checkpoint_dir: str) -> None:
        self.fn = SequenceDoFn(
            RawAttentionStep(backend="numpy"), checkpoint_dir=checkpoint_dir, checkpoint_every=4
        )
        self.fn.setup()
        self.seq = _Cell()
        self.buffer, self.outbuf, self.timer = _Bag(), _Bag(), _Timer()

    def _cells(self) -> tuple:
        return (self.seq, self.buffer, self.outbuf)

    def send(self, index: int, data: dict) -> list:
        element = ("s", Chunk("s", index, data))
        return list(self.fn.process(element, Timestamp(0), *self._cells(), self.timer))

    def idle(self) -> list:
        return list(self.fn.on_idle("s", *self._cells()))


def _data(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((2, 1, 2)) for name in "qkv"}


def test_returning_sequence_refuses_a_checkpoint_written_by_another_job(tmp_path):
    chunks = [_data(i) for i in range(12)]
    other_job = _Key(str(tmp_path))
    for i in range(12):  # commits up to next chunk 12 in the shared store
        other_job.send(i, chunks[i])
    other_job.fn._store.flush()

    job = _Key(str(tmp_path))  # resume off, same store: its history starts anew
    for i in range(2):
        assert all(isinstance(o, ChunkResult) for o in job.send(i, chunks[i]))
    # Its first commit would be commit 1 of the chain, which the other job holds: refused.
    dead = [o.value for o in job.idle() if isinstance(o, TaggedOutput)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(0, "fenced"), (1, "fenced")]
    assert "another job advanced this sequence" in dead[0].message
    outputs = job.send(2, chunks[2])
    dead = [o.value for o in outputs if isinstance(o, TaggedOutput)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(2, "fenced")]
    assert not [o for o in outputs if isinstance(o, ChunkResult)]
    # The other job's history is untouched.
    assert job.fn._store.restore("s", fingerprint=job.fn.step.fingerprint).next_chunk == 12


def test_evicted_sequence_refuses_a_history_another_job_advanced(tmp_path):
    chunks = [_data(i) for i in range(8)]
    job = _Key(str(tmp_path))
    for i in range(2):
        job.send(i, chunks[i])
    job.idle()  # commit 1 (next chunk 2), Beam state cleared
    other = _Key(str(tmp_path))
    other.fn.resume = True
    for i in range(2, 6):  # continues the same history: commit 2
        other.send(i, chunks[i])
    other.idle()
    outputs = job.send(2, chunks[2])
    dead = [o.value for o in outputs if isinstance(o, TaggedOutput)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(2, "restore_failed")]
    assert "another job advanced it" in dead[0].message
