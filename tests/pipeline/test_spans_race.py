"""Two jobs publishing one committed output span at once (a resumed job rolling a commit
forward while the job that made it still publishes it) leave the published file in place with
the span's bytes, and neither fails."""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
from linstream.pipeline.elements import ChunkResult
from linstream.pipeline.stage.spans import SpanWriter


def _span(out):
    results = [ChunkResult("s", i, 4 * i, np.full(3, i, np.float32)) for i in range(2, 5)]
    return SpanWriter(out, per_token=False).write_pending("s", results)


def _check(span):
    assert os.path.exists(span.file) and not os.path.exists(span.pending)
    assert pq.read_table(span.file).column("chunk_index").to_pylist() == [2, 3, 4]
    leftovers = [n for n in os.listdir(os.path.dirname(span.file)) if n.startswith(".")]
    assert leftovers == []


@pytest.mark.parametrize("written", [False, True], ids=["roll-forward", "own-span"])
@pytest.mark.parametrize("step", ["link", "replace"])
def test_another_job_publishing_in_the_middle_of_a_publish(tmp_path, monkeypatch, step, written):
    """The other job runs its whole publish (a roll-forward) at the moment this one is about to
    link (or to replace): the final file must survive and this publish must report it
    published, whether this one checks the files first or publishes the span it wrote."""
    out = str(tmp_path / "out")
    span = _span(out)
    mine, other = SpanWriter(out, per_token=False), SpanWriter(out, per_token=False)
    real = getattr(os, step)
    fired = []

    def interleaved(src, dst, *args, **kwargs):
        if not fired:
            fired.append(True)
            monkeypatch.setattr(os, step, real)
            assert other.publish(span)
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, step, interleaved)
    assert mine.publish(span, written=written)
    assert fired
    _check(span)


def test_many_concurrent_publishers(tmp_path):
    out = str(tmp_path / "out")
    span = _span(out)
    errors, answers = [], []
    start = threading.Barrier(8)

    def run(written):
        start.wait()
        try:
            answers.append(SpanWriter(out, per_token=False).publish(span, written=written))
        except Exception as ex:  # collected and asserted on below
            errors.append(ex)

    # one is the job that wrote the span, the others roll its commit forward
    threads = [threading.Thread(target=run, args=(i == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and answers == [True] * 8
    _check(span)
