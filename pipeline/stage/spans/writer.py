"""Writing output spans: the results a checkpoint commit finalizes, written as part of that
commit and published per output group, so that a job's result files grow with its results, not
with its sequences times its commits.

With a checkpoint store and an output folder, the stateful stage does not hand its results to a
batch sink (whose files only appear when the whole job ends, so a killed job lost every output
its checkpoints had already claimed).  Instead:

1. At a commit, the outputs of the chunks it applied are written under a hidden name
   (``.pending-<group>-…``, names.py; readers skip names starting with ``.``) and made
   durable.
2. The commit is created.  Its manifest records the span of the sequence's rows in the open
   output group: from its first chunk in the group (its earlier commits in the group are
   covered again) to the commit's end, with the digest of those rows (rows.py) and the
   commit's own pending file.
3. When the group closes (at the end of the bundle, or once it holds `GROUP_BYTES` of
   results), its committed rows are published as one file, ``part-<group>-0000.parquet``
   (group_files.py), and its pending files go.

A crash before 2 leaves hidden orphans (the chunks are recomputed from the previous commit).  A
crash between 2 and 3 is rolled forward by the next job that restores the sequence, whatever
its own output folder: the newest commit's span names the group, and its rows are in the
sequence's pending files of that group (or already in its files).  A commit that loses a race
(a retried bundle, another job) discards its own pending file.  So the published files hold
every committed chunk once.  The pending name carries the number of the commit it is written
for: a job that restores the sequence removes those whose number the history already holds,
once the newest span is published (ownership decides, never a file's age).

A manifest is untrusted input, and so are the names its span records: `SpanWriter.check`
confirms their form (names.py) and that the results folder is this job's own or one a job
of the same checkpoint store marked, before any file they name is touched.  Spans of earlier
versions (one file per sequence and commit) are read and rolled forward (legacy.py).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from linstream.pipeline.result_metadata import with_compute_dtype
from linstream.state import OutputSpan
from linstream.state.store import FsspecStorage, in_thread, open_storage

from . import legacy
from .group_files import ResultsFolder, storage_url
from .names import (
    RESULTS_DIR,
    group_file,
    has_store_mark,
    mark_name,
    new_group_id,
    parse_pending,
    pending_name,
    refused,
    seq_key,
    span_check,
    span_place,
)
from .rows import RowsDigest, concat, parquet_bytes, spans_table

if TYPE_CHECKING:  # Beam is not imported here: `linstream checkpoint verify` uses `span_check`
    from linstream.pipeline.values import ChunkResult

__all__ = ["GROUP_BYTES", "RESULTS_DIR", "SpanWriter", "Staged", "span_check", "spans_table"]

_log = logging.getLogger(__name__)

#: An open output group is published once its pending files hold this many bytes.
GROUP_BYTES = 64 << 20


@dataclass
class _Rows:
    """A sequence's committed rows in the open group (the span its next commit extends)."""

    first: int
    tables: list[pa.Table]
    digest: RowsDigest
    rows: int
    pending: str  # the newest pending file (its URL) and its size
    size: int


@dataclass
class Staged:
    """A commit's span, written (``writing``: its pending file's write, None when the commit
    adds no rows) but not committed yet."""

    seq_id: str
    span: OutputSpan
    rows: _Rows
    writing: Any = None
    path: str | None = None  # the pending file (storage path) this commit writes


@dataclass
class _Group:
    id: str
    seqs: dict[str, _Rows] = field(default_factory=dict)
    #: rows no longer a sequence's span here (another job continued it), published if missing
    extra: list[pa.Table] = field(default_factory=list)
    written: list[str] = field(default_factory=list)  # every pending file (path) of the group
    bytes: int = 0


class SpanWriter:
    """Writes the spans of its job's commits, publishes them per group, and rolls forward,
    rolls back and tidies the spans a store's commits name (see the module docstring)."""

    def __init__(
        self,
        output: str,
        *,
        per_token: bool,
        store_location: str | None = None,
        group_bytes: int = GROUP_BYTES,
        compute_dtype: str | None = None,
    ) -> None:
        self.output = output
        #: The mode the rows are computed in: each span file's schema metadata records it.
        self.compute_dtype = compute_dtype
        self.per_token = per_token
        self.group_bytes = group_bytes
        self._fs = open_storage(output.rstrip("/") + "/" + RESULTS_DIR)
        self._own = self._url(self._fs.root)
        self._folders: dict[str, ResultsFolder] = {}
        #: ``CheckpointStore.location`` of the store whose commits name these spans: output
        #: folders it marked are trusted besides this one (see `check`).
        self.store_location = store_location
        self._marked = False
        self._trusted: set[str] = {self._own}
        self._group: _Group | None = None
        #: Called before rows are published: makes the commits that name them durable (this
        #: job's own, batched: ``CheckpointStore.sync``; a sequence's, whoever made them:
        #: ``CheckpointStore.sync_seq``).  Set by the stage; no-ops without a store.
        self.durable: Callable[[], None] = _nothing
        self.durable_seq: Callable[[str], None] = _nothing_for

    def _url(self, path: str) -> str:
        return storage_url(self._fs, path)

    def _folder(self, results: str) -> ResultsFolder:
        if results not in self._folders:
            self._folders[results] = ResultsFolder(results)
        return self._folders[results]

    # -- which files a span may name -------------------------------------------------------
    def _ensure_marked(self) -> None:
        """Make this output folder and mark it as one that jobs of the store write into
        (once)."""
        if self._marked:
            return
        self._fs.makedirs(self._fs.root)
        if self.store_location is None:
            self._marked = True
            return
        body = json.dumps({"store": self.store_location}).encode("utf-8") + b"\n"
        self._fs.write_immutable(self._fs.join(mark_name(self.store_location)), body)
        self._marked = True

    def check(self, span: OutputSpan, seq_id: str | None = None) -> bool:
        """`CorruptCheckpointError` unless ``span`` (read from a manifest: untrusted) names
        files of a form written here (names.py), in this job's results folder or in one
        that the store marked.  False (nothing to touch: its outputs are lost) when its results
        folder does not exist at all, as after a user removed an old output folder."""
        results = span_place(span, seq_id).results
        if results in self._trusted:
            self._ensure_marked()
            return True
        marked = (
            None if self.store_location is None else has_store_mark(results, self.store_location)
        )
        if marked is None and (self.store_location is not None or not _exists(results)):
            return False
        if not marked:
            why = (
                f"{results} is neither this job's output folder nor one marked by this store "
                f"(a folder written by an earlier version is marked by one --resume with "
                f"--output {results.rpartition('/')[0]})"
            )
            raise refused(span, why)
        self._trusted.add(results)
        return True

    # -- this job's spans -----------------------------------------------------------------
    def _open(self) -> _Group:
        if self._group is None:
            self._group = _Group(new_group_id())
        return self._group

    def stage(
        self, seq_id: str, results: list[ChunkResult], *, commit: int, since: int, end: int
    ) -> Staged | None:
        """Step 1 for commit ``commit`` of ``seq_id``, which covers its chunks ``since ..
        end - 1``: their ``results`` written to a pending file in a thread, and the span the
        commit is to name (None: the sequence has no rows in the group)."""
        group = self._open()
        before = group.seqs.get(seq_id)
        if not results:
            if before is None:
                return None
            return Staged(seq_id, self._span(group, before, end), before)
        results = sorted(results, key=lambda r: int(r.index))
        first, last = int(results[0].index), int(results[-1].index)
        if last - first + 1 != len(results) or first < since or last >= end:
            msg = (
                f"sequence {seq_id!r}: outputs of chunks {first}..{last} are not the "
                f"contiguous chunks of a commit of chunks {since}..{end - 1}"
            )
            raise ValueError(msg)
        table = with_compute_dtype(
            spans_table(results, per_token=self.per_token), self.compute_dtype
        )
        data = parquet_bytes(table)
        self._ensure_marked()
        path = self._fs.join(pending_name(group.id, seq_id, since, end, commit))
        writing = in_thread(self._fs.write_immutable, path, data)
        group.written.append(path)
        rows = _Rows(
            since if before is None else before.first,
            [*([] if before is None else before.tables), table],
            (RowsDigest() if before is None else before.digest.copy()).add(table),
            (0 if before is None else before.rows) + table.num_rows,
            self._url(path),
            int(data.size),
        )
        return Staged(seq_id, self._span(group, rows, end), rows, writing, path)

    def _span(self, group: _Group, rows: _Rows, end: int) -> OutputSpan:
        return OutputSpan(
            self._url(self._fs.join(group_file(group.id))),
            rows.pending,
            rows.first,
            end,
            rows.rows,
            rows.size,
            rows.digest.hexdigest(),
        )

    def committed(self, staged: Staged) -> None:
        """The commit naming ``staged.span`` was created: its rows are the sequence's span in
        the group (published when the group closes)."""
        group = self._open()
        group.seqs[staged.seq_id] = staged.rows
        if staged.writing is not None:
            group.bytes += staged.rows.size
        if group.bytes >= self.group_bytes:
            self.flush()

    def discard(self, staged: Staged) -> None:
        """A commit that did not happen: its pending file goes (the group's earlier rows of
        the sequence stand: their commits did happen)."""
        if staged.path is not None:
            self._fs.remove(staged.path)

    def forget(self, seq_id: str) -> None:
        """The sequence is being restored from the store: its rows in the open group were its
        newest commit's, which the restore rolls forward (or rolls back, or finds lost and
        computes again), so the group does not publish them too."""
        if self._group is not None:
            self._group.seqs.pop(seq_id, None)

    def continued_elsewhere(self, seq_id: str) -> None:
        """Another commit stands where this job's was (a retried bundle, a twin job): the
        sequence's span in the group starts again after it; its earlier rows here are
        published if the other job did not already."""
        group = self._open()
        rows = group.seqs.pop(seq_id, None)
        if rows is not None:
            group.extra.extend(rows.tables)

    def flush(self) -> None:
        """Step 3: publish the open group's committed rows in one file; its pending files go."""
        group, self._group = self._group, None
        if group is None:
            return
        tables = [t for rows in group.seqs.values() for t in rows.tables] + group.extra
        if tables:
            self.durable()  # the commits naming these rows first
            self._before_publish(group)
            self._folder(self._own).publish(group.id, concat(tables))
        # On the I/O pool, in parallel: one unlink waits for the disk's journal (~1-3 ms).
        for removing in [in_thread(self._fs.remove, path) for path in group.written]:
            removing.result()

    def _before_publish(self, group: _Group) -> None:
        """Called just before a group is published (a test's fault hook)."""

    def reset(self) -> None:
        """Forget the open group (a bundle that failed: its commits are rolled forward by the
        jobs that restore their sequences)."""
        self._group = None

    # -- spans a store names --------------------------------------------------------------
    def publish(self, span: OutputSpan, seq_id: str, commit: int) -> bool:
        """Roll forward the span of commit ``commit``: its rows are published (it names
        files in a form written here, checked first).  False when they are lost: neither the
        published files nor the pending ones hold them."""
        if not self.check(span, seq_id):
            return False  # its folder is gone: nothing holds the span
        place = span_place(span, seq_id)
        if place.group is None:
            self.durable_seq(seq_id)
            return legacy.publish(span)
        ok, parts = self._folder(place.results).roll_forward(
            span, place.group, seq_id, commit, before_publish=lambda: self.durable_seq(seq_id)
        )
        if ok:
            folder = self._folder(place.results)
            for name in parts:
                folder.fs.remove(folder.path(name))
        return ok

    def discard_lost(self, span: OutputSpan, seq_id: str, commit: int) -> None:
        """The span's outputs are lost and will be computed again: what is left of them (its
        pending files, its rows in published files) goes, so they are published once."""
        if not self.check(span, seq_id):
            return
        place = span_place(span, seq_id)
        if place.group is None:
            legacy.discard(span)
            legacy.remove_published(span)
            return
        folder = self._folder(place.results)
        for name, _p in folder.pending_parts(span, place.group, seq_id, commit, folder.names()):
            folder.fs.remove(folder.path(name))
        folder.remove_rows(place.group, seq_id, span.first_chunk, span.end_chunk)

    def remove_published(self, span: OutputSpan, seq_id: str, again: int) -> None:
        """The published rows of a commit that is being rolled back: those of its chunks from
        ``again`` on (the chunks applied again; a group span also covers the sequence's
        earlier commits in its group, which stand)."""
        if not self.check(span, seq_id):
            return
        place = span_place(span, seq_id)
        if place.group is None:
            legacy.remove_published(span)
        else:
            self._folder(place.results).remove_rows(
                place.group, seq_id, max(span.first_chunk, again), span.end_chunk
            )

    def remove_orphans(self, seq_id: str, *, up_to_commit: int) -> int:
        """Remove the sequence's hidden pending files in this output folder that belong to a
        commit numbered ``up_to_commit`` or lower: the sequence's history holds those numbers
        already (its newest commit, ``up_to_commit``, was rolled forward first), so each such
        file's rows were published, or its writer lost that number or stopped before creating
        it.  A writer still working on one will find its number taken and discard its span
        anyway.  Files of this job's open group are its own, and stay.

        Ownership alone decides, never a file's age: a writer paused for an hour, or one whose
        clock is off, keeps the pending file of the commit it is about to create (a higher
        number).  Files of earlier versions without a commit number are left alone."""
        key = seq_key(seq_id)
        mine = None if self._group is None else self._group.id
        removed = 0
        for name in self._fs.list_dir(self._fs.root):
            p = parse_pending(name)
            if p is None or p.key != key or p.commit > up_to_commit or p.group == mine:
                continue
            self._fs.remove(self._fs.join(name))
            removed += 1
        removed += legacy.remove_orphans(self._fs, seq_id, up_to_commit)
        if removed:
            _log.info("removed %d unfinished output files of sequence %r", removed, seq_id)
        return removed


def _nothing() -> None:
    pass


def _nothing_for(_seq_id: str) -> None:
    pass


def _exists(folder: str) -> bool:
    try:
        fs = open_storage(folder)
        if isinstance(fs, FsspecStorage):
            return bool(fs.fs.exists(fs.root))
        return os.path.lexists(fs.root)
    except (OSError, ValueError, ImportError):
        return True  # unknown: taken as there (and refused)
