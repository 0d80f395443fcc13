"""An evicted sequence refuses a newer checkpoint that another job wrote to the same store.

Drives the stateful DoFn directly with in-memory stand-ins for Beam's state cells, so the idle
timer can be fired at a chosen moment.
"""

from __future__ import annotations

import numpy as np
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp
from linstream.pipeline.core import SequenceDoFn
from linstream.pipeline.elements import Chunk, ChunkResult
from linstream.pipeline.steps import RawAttentionStep


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
        self.state, self.meta, self.buffer, self.timer = _Cell(), _Cell(), _Bag(), _Timer()

    def send(self, index: int, data: dict) -> list:
        element = ("s", Chunk("s", index, data))
        args = (self.state, self.meta, self.buffer, self.timer)
        return list(self.fn.process(element, Timestamp(0), *args))

    def idle(self) -> list:
        return list(self.fn.on_idle("s", self.state, self.meta, self.buffer))


def _data(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((2, 1, 2)) for name in "qkv"}


def test_returning_sequence_refuses_a_checkpoint_written_by_another_job(tmp_path):
    chunks = [_data(i) for i in range(12)]
    other_job = _Key(str(tmp_path))
    for i in range(12):  # commits up to next chunk 12 in the shared store
        other_job.send(i, chunks[i])
    other_job.fn._store.flush()

    job = _Key(str(tmp_path))  # resume off, same store
    for i in range(2):
        assert all(isinstance(o, ChunkResult) for o in job.send(i, chunks[i]))
    job.idle()  # commits next chunk 2 and clears Beam state
    job.fn._store.flush()

    outputs = job.send(2, chunks[2])
    dead = [o.value for o in outputs if isinstance(o, TaggedOutput)]
    assert [(d.chunk_index, d.reason) for d in dead] == [(2, "restore_failed")]
    assert "another job wrote to this checkpoint directory" in dead[0].message
    assert not [o for o in outputs if isinstance(o, ChunkResult)]
