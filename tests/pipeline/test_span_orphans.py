"""Which hidden pending files a restoring job removes: those of commit numbers the sequence's
history holds, whatever their age; never one of a higher number (a commit still to come), never
one without a number (written by an earlier version), however old."""

from __future__ import annotations

import os

import numpy as np
from linstream.pipeline.elements import ChunkResult
from linstream.pipeline.stage.spans import SpanWriter


def _pending(writer: SpanWriter, first: int, commit: int | None) -> str:
    results = [
        ChunkResult("s", i, 4 * i, np.full(3, i, np.float32)) for i in range(first, first + 2)
    ]
    span = writer.write_pending("s", results, commit=commit)
    os.utime(span.pending, (0, 0))  # all of them as old as can be
    return span.pending


def test_orphans_go_by_commit_number_never_by_age(tmp_path):
    writer = SpanWriter(str(tmp_path / "out"), per_token=False)
    done = [_pending(writer, 0, 1), _pending(writer, 2, 2), _pending(writer, 2, 2)]
    to_come = _pending(writer, 4, 3)
    unnumbered = _pending(writer, 6, None)
    assert writer.remove_orphans("s", up_to_commit=2) == 3
    assert not any(os.path.exists(p) for p in done)
    assert os.path.exists(to_come) and os.path.exists(unnumbered)
    assert writer.remove_orphans("s", up_to_commit=2) == 0
