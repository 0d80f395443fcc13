"""Jobs publishing one committed output span at once (a resumed job rolling a commit forward
while the job that made it still publishes its output group) leave every row of the span in the
group's files once, and none of them fails."""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
from linstream.pipeline.elements import ChunkResult
from linstream.pipeline.stage.spans import SpanWriter


def _committed(out):
    """A job whose open group holds the committed span of chunks 2..4 of "s" (commit 1)."""
    writer = SpanWriter(out, per_token=False)
    results = [ChunkResult("s", i, 4 * i, np.full(3, i, np.float32)) for i in range(2, 5)]
    staged = writer.stage("s", results, commit=1, since=2, end=5)
    assert staged is not None
    staged.writing.result()
    writer.committed(staged)
    return writer, staged.span


def _check(out):
    folder = os.path.join(out, "results")
    names = os.listdir(folder)
    rows = [
        i
        for n in names
        if not n.startswith(".")
        for i in pq.read_table(os.path.join(folder, n)).column("chunk_index").to_pylist()
    ]
    assert sorted(rows) == [2, 3, 4], names
    assert [n for n in names if n.startswith(".")] == []


@pytest.mark.parametrize("interrupted", ["the-job", "a-roll-forward"])
def test_another_job_publishing_in_the_middle_of_a_publish(tmp_path, monkeypatch, interrupted):
    """The other one runs its whole publish at the moment this one is about to create the
    group's file: the rows are published once and both report them published."""
    out = str(tmp_path / "out")
    job, span = _committed(out)
    roll = SpanWriter(out, per_token=False)
    real = os.link
    fired = []

    def interleaved(src, dst, *args, **kwargs):
        if not fired:
            fired.append(True)
            monkeypatch.setattr(os, "link", real)
            if interrupted == "the-job":
                assert roll.publish(span, "s", 1)
            else:
                job.flush()
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", interleaved)
    if interrupted == "the-job":
        job.flush()
    else:
        assert roll.publish(span, "s", 1)
    assert fired
    _check(out)


def test_many_concurrent_publishers(tmp_path):
    out = str(tmp_path / "out")
    job, span = _committed(out)
    errors, answers = [], []
    start = threading.Barrier(8)

    def run(own):
        start.wait()
        try:
            if own:
                job.flush()
                answers.append(True)
            else:
                answers.append(SpanWriter(out, per_token=False).publish(span, "s", 1))
        except Exception as ex:  # collected and asserted on below
            errors.append(ex)

    # one is the job that wrote the span, the others roll its commit forward
    threads = [threading.Thread(target=run, args=(i == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and answers == [True] * 8
    _check(out)
