"""A results folder's group files: what they hold, publishing rows into them exactly once, and
finding a committed span's rows there or in its pending files.

An output group (names.py) is published as files ``part-<group>-<k>.parquet``, k = 0, 1,
..., each created with create-if-absent (``O_EXCL``/``link`` on local disk, ``If-None-Match``
/ ``ifGenerationMatch=0`` on object stores).  `ResultsFolder.publish` lists the group's files,
reads which (sequence, chunk) rows they hold, and creates the next file with the rows they do
not hold; when another publisher created that name first, it reads the files again and goes
on.  So however many jobs publish rows of one group at once (the job that wrote it, and jobs
rolling its commits forward after a crash), each row is in the group's files once.

A commit's span names its sequence's rows ``first_chunk .. end_chunk - 1`` in a group, the
digest of those rows (`RowsDigest`) and the pending file of the commit's own chunks; the rows of
the sequence's earlier commits in the same group are in pending files of lower commit numbers
(`Pending`).  `ResultsFolder.roll_forward` gathers the rows from the group's files and those
pending files, checks their number and digest against the span, and publishes the ones not
published yet; or reports them lost (a file deleted or damaged by hand).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from linstream.state import OutputSpan
from linstream.state.store import FsspecStorage, LocalStorage, open_storage

from .names import Pending, member_index, member_name, parse_pending, seq_key
from .rows import (
    RowsDigest,
    concat,
    parquet_bytes,
    read_parquet_bytes,
    rows_of,
    without_rows,
)

__all__ = ["ResultsFolder"]

_log = logging.getLogger(__name__)

#: How many times `publish` lists a group's files again after losing a create to another job.
_ATTEMPTS = 32
#: Bytes of group files kept parsed in memory (a resumed job checks every sequence's newest
#: span against the same few files).
_CACHE_BYTES = 256 << 20
#: Read at most this much of one pending or group file.
_MAX_FILE_BYTES = 4 << 30


class ResultsFolder:
    """One results folder (a local path or fsspec URL) and its group files."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs: LocalStorage | FsspecStorage = open_storage(url)
        self._tables: OrderedDict[str, pa.Table | None] = OrderedDict()
        self._cached = 0

    def path(self, name: str) -> str:
        return self.fs.join(name)

    def names(self) -> list[str]:
        return self.fs.list_dir(self.fs.root)

    # -- the group's files ------------------------------------------------------------------
    def _members(self, group: str, names: list[str]) -> list[tuple[int, str]]:
        found = ((member_index(n, group), n) for n in names)
        return sorted((k, n) for k, n in found if k is not None)

    def _table(self, name: str, *, fresh: bool = False) -> pa.Table | None:
        """A group file's rows (cached; None when it cannot be read as result rows: damaged)."""
        if not fresh and name in self._tables:
            self._tables.move_to_end(name)
            return self._tables[name]
        try:
            data = self.fs.read(self.path(name), _MAX_FILE_BYTES)
        except FileNotFoundError:
            self._forget(name)
            raise
        try:
            table: pa.Table | None = read_parquet_bytes(data)
        except ValueError as ex:
            _log.warning("result file %s cannot be read: %s", self.path(name), ex)
            table = None
        self._remember(name, table)
        return table

    def _remember(self, name: str, table: pa.Table | None) -> None:
        self._forget(name)
        self._tables[name] = table
        self._cached += 0 if table is None else table.nbytes
        while self._cached > _CACHE_BYTES and len(self._tables) > 1:
            _, old = self._tables.popitem(last=False)
            self._cached -= 0 if old is None else old.nbytes

    def _forget(self, name: str) -> None:
        old = self._tables.pop(name, None)
        self._cached -= 0 if old is None else old.nbytes

    def _held(self, group: str, names: list[str], *, fresh: bool = False) -> list[pa.Table]:
        """The readable rows of the group's files."""
        out = []
        for _k, name in self._members(group, names):
            try:
                table = self._table(name, fresh=fresh)
            except FileNotFoundError:  # removed meanwhile (its rows moved or rolled back)
                continue
            if table is not None:
                out.append(table)
        return out

    def publish(self, group: str, rows: pa.Table) -> int:
        """Make every row of ``rows`` be in the group's files once: the rows they do not hold
        yet go into a new file.  Returns how many rows this call wrote."""
        names = self.names()
        for _attempt in range(_ATTEMPTS):
            held = {
                key
                for table in self._held(group, names)
                for key in zip(
                    table.column("seq_id").to_pylist(),
                    table.column("chunk_index").to_pylist(),
                    strict=True,
                )
            }
            if held:
                keys = zip(
                    rows.column("seq_id").to_pylist(),
                    rows.column("chunk_index").to_pylist(),
                    strict=True,
                )
                rows = rows.filter(pa.array([key not in held for key in keys]))
            if rows.num_rows == 0:
                return 0
            members = self._members(group, names)
            name = member_name(group, members[-1][0] + 1 if members else 0)
            if self.fs.create_exclusive(self.path(name), bytes(parquet_bytes(rows))):
                self._remember(name, rows)
                return int(rows.num_rows)
            names = self.names()  # another job published part of the group meanwhile
        msg = f"{self.url}: could not publish group {group} after {_ATTEMPTS} attempts"
        raise OSError(msg)

    def remove_rows(self, group: str, seq_id: str, first: int, end: int) -> None:
        """Remove the rows of ``seq_id``'s chunks ``first .. end - 1`` from the group's files
        (a file that cannot be read at all goes as a whole: it holds nothing a reader gets)."""
        for _k, name in self._members(group, self.names()):
            path = self.path(name)
            try:
                table = self._table(name, fresh=True)
            except FileNotFoundError:
                continue
            if table is None:
                _log.warning("removing the damaged result file %s", path)
                self.fs.remove(path)
                self._forget(name)
                continue
            rest = without_rows(table, seq_id, first, end)
            if rest.num_rows == table.num_rows:
                continue
            if rest.num_rows == 0:
                self.fs.remove(path)
                self._forget(name)
            else:
                self.fs.write_immutable(path, parquet_bytes(rest))  # replaced at once
                self._remember(name, rest)

    # -- a committed span's rows ------------------------------------------------------------
    def pending_parts(
        self, span: OutputSpan, group: str, seq_id: str, commit: int, names: list[str]
    ) -> list[tuple[str, Pending]]:
        """The pending files that hold rows of the span: the sequence's, in the group, within
        its chunks, of commit numbers up to ``commit`` (the span's own commit)."""
        key = seq_key(seq_id)
        out = []
        for name in names:
            p = parse_pending(name)
            if (
                p is not None
                and p.group == group
                and p.key == key
                and span.first_chunk <= p.first
                and p.end <= span.end_chunk
                and p.commit <= commit
            ):
                out.append((name, p))
        return sorted(out, key=lambda np_: np_[1].first)

    def _read_pending(self, name: str, span: OutputSpan) -> pa.Table | None:
        own = name == span.pending.rpartition("/")[2]
        try:
            data = self.fs.read(self.path(name), span.size if own else _MAX_FILE_BYTES)
        except FileNotFoundError:
            return None
        if own and len(data) != span.size:
            return None
        try:
            return read_parquet_bytes(data)
        except ValueError:
            return None

    def roll_forward(
        self,
        span: OutputSpan,
        group: str,
        seq_id: str,
        commit: int,
        *,
        before_publish: Callable[[], object] | None = None,
    ) -> tuple[bool, list[str]]:
        """Make the span's rows be in the group's files: (True, the pending files that held
        rows it published) when the rows found (published, or pending) are exactly the span's
        (number and digest); (False, []) when they are not all there (lost).
        ``before_publish`` is called before any rows are published (it makes the commit that
        names them durable)."""
        for attempt in range(2):  # again with fresh reads: another job may have moved rows
            names = self.names()
            published = [
                rows_of(t, seq_id, span.first_chunk, span.end_chunk)
                for t in self._held(group, names, fresh=attempt > 0)
            ]
            have = {i for t in published for i in t.column("chunk_index").to_pylist()}
            parts = self.pending_parts(span, group, seq_id, commit, names)
            pending: list[pa.Table] = []
            for name, p in parts:
                if set(range(p.first, p.end)) <= have:
                    continue
                table = self._read_pending(name, span)
                if table is not None:
                    rows = rows_of(table, seq_id, span.first_chunk, span.end_chunk)
                    keep = [i not in have for i in rows.column("chunk_index").to_pylist()]
                    pending.append(rows.filter(pa.array(keep, pa.bool_())))
                    have |= set(rows.column("chunk_index").to_pylist())
            found = [t for t in (*published, *pending) if t.num_rows]
            if found and _matches(concat(found), span):
                new = [t for t in pending if t.num_rows]
                if new:
                    if before_publish is not None:
                        before_publish()
                    self.publish(group, concat(new))
                return True, [n for n, _ in parts]
        return False, []


def _matches(rows: pa.Table, span: OutputSpan) -> bool:
    rows = rows.take(pc.sort_indices(rows.column("chunk_index")))
    if rows.num_rows != span.rows:
        return False
    return RowsDigest().add(rows).hexdigest() == span.sha256


def storage_url(fs: Any, path: str) -> str:
    """A storage path as the URL a manifest records."""
    if isinstance(fs, FsspecStorage):
        return f"{fs.protocol}://{path}"
    return str(path)
