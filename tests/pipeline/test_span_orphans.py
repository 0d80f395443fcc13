"""Which hidden pending files a restoring job removes: those of commit numbers the sequence's
history holds, whatever their age; never one of a higher number (a commit still to come), never
one without a number (written by an earlier version), however old."""

from __future__ import annotations

import os

import numpy as np
from linstream.pipeline.elements import ChunkResult
from linstream.pipeline.stage.spans import SpanWriter
from linstream.state.store.paths import encode_seq_dir


def _pending(writer: SpanWriter, first: int, commit: int) -> str:
    """A pending file of another job's output group (each call its own group)."""
    results = [
        ChunkResult("s", i, 4 * i, np.full(3, i, np.float32)) for i in range(first, first + 2)
    ]
    staged = writer.stage("s", results, commit=commit, since=first, end=first + 2)
    assert staged is not None and staged.path is not None
    staged.writing.result()
    writer.reset()  # the next call writes for another group
    os.utime(staged.path, (0, 0))  # all of them as old as can be
    return staged.path


def _legacy_pending(out: str, first: int, commit: int | None) -> str:
    """A pending file in the per-sequence form of earlier versions."""
    folder = os.path.join(out, "results", encode_seq_dir("s"))
    os.makedirs(folder, exist_ok=True)
    number = "" if commit is None else f"{commit:020d}-"
    name = f".pending-{first:012d}-{first + 2:012d}-{number}{os.urandom(6).hex()}.parquet"
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(b"old")
    os.utime(path, (0, 0))
    return path


def test_orphans_go_by_commit_number_never_by_age(tmp_path):
    out = str(tmp_path / "out")
    other = SpanWriter(out, per_token=False)
    done = [_pending(other, 0, 1), _pending(other, 2, 2), _pending(other, 2, 2)]
    done.append(_legacy_pending(out, 0, 1))
    to_come = [_pending(other, 4, 3), _legacy_pending(out, 4, 3)]
    unnumbered = _legacy_pending(out, 6, None)
    writer = SpanWriter(out, per_token=False)
    assert writer.remove_orphans("s", up_to_commit=2) == 4
    assert not any(os.path.exists(p) for p in done)
    assert all(os.path.exists(p) for p in to_come) and os.path.exists(unnumbered)
    assert writer.remove_orphans("s", up_to_commit=2) == 0


def test_the_open_groups_own_pending_files_stay(tmp_path):
    """A job's own pending files of its open group are its commits' (published when the
    group closes), whatever the commit number a restore of the sequence names."""
    writer = SpanWriter(str(tmp_path / "out"), per_token=False)
    results = [ChunkResult("s", i, 4 * i, np.full(3, i, np.float32)) for i in range(2)]
    staged = writer.stage("s", results, commit=1, since=0, end=2)
    assert staged is not None and staged.path is not None
    staged.writing.result()
    writer.committed(staged)
    assert writer.remove_orphans("s", up_to_commit=5) == 0
    assert os.path.exists(staged.path)
