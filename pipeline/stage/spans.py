"""Output spans: the results a checkpoint commit finalizes, written as part of that commit.

With a checkpoint store and an output folder, the stateful stage does not hand its results to a
batch sink (whose files only appear when the whole job ends, so a killed job lost every output
its checkpoints had already claimed).  Instead each commit covers the outputs of the chunks it
applied, ``first_chunk .. end_chunk - 1`` of one sequence:

1. the span is written under a hidden name (``.pending-…``: readers of the results folder skip
   names starting with ``.``) and made durable;
2. the commit is created; its manifest records the span (both names, rows, size, SHA-256);
3. the span is published under its final name ``<first:012d>-<end:012d>.parquet`` in the
   sequence's folder ``<output>/results/<seq folder>/``.

A crash before 2 leaves a hidden orphan (the chunks are recomputed from the previous commit and
their span written again); a crash between 2 and 3 is rolled forward by the next job that
restores the sequence, whatever its output folder, because the manifest names the files.  A
commit that loses a race (a retried bundle, another job) discards its own pending file.  So the
published files hold every committed chunk once.  The pending name carries the number of the
commit it is written for: a job that restores the sequence into this folder removes orphans
whose number the history already holds (ownership decides, never a file's age).

A manifest is untrusted input, and so are the two names its span records.  Before any file a
span names is read, published or removed, `check` confirms that both names have exactly the
form written here (``<results folder>/<seq folder>/<first>-<end>.parquet`` and its ``.pending-``
sibling) and that the results folder is this job's own or one that a job of the same checkpoint
store marked as its output (`mark_name`: a hidden file that only a job given both folders
writes).  A span naming anything else is refused (`CorruptCheckpointError`), and nothing it
names is touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from linstream.state import CorruptCheckpointError, OutputSpan
from linstream.state.store.filesystems import (
    FsspecStorage,
    LocalStorage,
    in_thread,
    open_storage,
)
from linstream.state.store.manifest import Manifest
from linstream.state.store.paths import decode_seq_dir, encode_seq_dir, is_hashed_seq_dir

if TYPE_CHECKING:  # Beam is not imported here: `linstream checkpoint verify` uses `span_check`
    from linstream.pipeline.elements import ChunkResult

__all__ = [
    "RESULTS_DIR",
    "SpanWriter",
    "has_store_mark",
    "mark_name",
    "results_folder_of",
    "span_check",
    "spans_table",
]

#: Sub-folder of a job's output folder that holds the result files.
RESULTS_DIR = "results"
_PENDING = ".pending-"
_PENDING_RE = re.compile(
    r"\.pending-([0-9]{12})-([0-9]{12})-(?:([0-9]{20})-)?[0-9a-f]{12}\.parquet"
)
_SCHEME_RE = re.compile(r"([a-z][a-z0-9+.-]*)://")
_MARK = ".linstream-store-"

_log = logging.getLogger(__name__)


def spans_table(results: list[ChunkResult], *, per_token: bool) -> pa.Table:
    """One row per chunk: seq_id, chunk_index, start_position and ``embeddings`` (one vector
    per token) or ``embedding`` (one vector per chunk), float32."""
    first = results[0].output
    width = int(np.prod(first.shape[1:])) if per_token else int(np.prod(first.shape))
    flat = np.concatenate([np.asarray(r.output, np.float32).reshape(-1) for r in results])
    vec = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), width)
    if per_token:
        lengths = np.array([len(r.output) for r in results], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        payload: pa.Array = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), vec)
        name = "embeddings"
    else:
        payload, name = vec, "embedding"
    return pa.table(
        {
            "seq_id": pa.array([r.seq_id for r in results], pa.string()),
            "chunk_index": pa.array([int(r.index) for r in results], pa.int64()),
            "start_position": pa.array([int(r.start_position) for r in results], pa.int64()),
            name: payload,
        }
    )


def mark_name(store_location: str) -> str:
    """The hidden file in a results folder that says jobs of the store at ``store_location``
    (``CheckpointStore.location``) write their outputs there."""
    return _MARK + hashlib.sha256(store_location.encode("utf-8")).hexdigest()[:32]


def _refused(span: OutputSpan, why: str) -> CorruptCheckpointError:
    msg = (
        f"its output span names files outside the output folders of this store's jobs "
        f"({span.file!r:.160}): {why}; linstream does not touch them"
    )
    return CorruptCheckpointError(msg)


def _normal_folder(url: str) -> bool:
    """An absolute local path or a URL, with no empty, ``.`` or ``..`` part and no control
    characters or backslashes."""
    if any(ord(c) < 32 or c in "\\\x7f" for c in url):
        return False
    scheme = _SCHEME_RE.match(url)
    if scheme is not None:
        parts = url[scheme.end() :].split("/")
    elif url.startswith("/"):
        parts = url[1:].split("/")
    else:
        return False
    return all(p not in ("", ".", "..") for p in parts)


def results_folder_of(span: OutputSpan, seq_id: str | None = None) -> str:
    """The results folder (``<output>/results``, as a path or URL) that the span's two files
    are in, checking that they have exactly the form `SpanWriter` gives them, for ``seq_id``
    when given; else `CorruptCheckpointError` saying what is wrong."""
    folder, _, name = span.file.rpartition("/")
    pfolder, _, pname = span.pending.rpartition("/")
    results, _, seq_dir = folder.rpartition("/")
    want = f"{span.first_chunk:012d}-{span.end_chunk:012d}.parquet"
    pending = _PENDING_RE.fullmatch(pname)
    if name != want or pending is None or pending.group(1, 2) != tuple(want[:-8].split("-")):
        raise _refused(span, f"expected the files {want} and {_PENDING}{want[:-8]}-….parquet")
    if pfolder != folder:
        raise _refused(span, "its pending file is in another folder than its result file")
    expected_dir = None if seq_id is None else encode_seq_dir(seq_id)
    if (expected_dir is not None and seq_dir != expected_dir) or not (
        decode_seq_dir(seq_dir) is not None or is_hashed_seq_dir(seq_dir)
    ):
        want_dir = expected_dir or "a sequence folder"
        raise _refused(span, f"expected them in {want_dir}, found folder {seq_dir!r:.80}")
    if results.rpartition("/")[2] != RESULTS_DIR or not _normal_folder(results):
        raise _refused(span, f"expected an absolute <output>/{RESULTS_DIR}/ folder")
    return results


def has_store_mark(results: str, store_location: str) -> bool | None:
    """Whether the results folder ``results`` holds the mark of the store (a regular file;
    never a link); None when there is no such folder at all (nothing there to touch)."""
    try:
        fs = open_storage(results)
        path = fs.join(mark_name(store_location))
        if isinstance(fs, LocalStorage):
            try:
                return stat.S_ISREG(os.lstat(path).st_mode)
            except FileNotFoundError:
                return None if not os.path.lexists(fs.root) else False
        if fs.fs.isfile(path):
            return True
        return None if not fs.fs.exists(fs.root) else False
    except (OSError, ValueError, ImportError):  # unreachable, or no such filesystem
        return False


def span_check(store_location: str) -> Callable[[Manifest], None]:
    """A manifest check (for ``CheckpointStore.verify``): the output span a commit names, if
    any, is in the form linstream writes and in a results folder marked by this store."""
    seen: dict[str, bool] = {}

    def check(m: Manifest) -> None:
        span = None if m.history is None else m.history.outputs
        if span is None:
            return
        results = results_folder_of(span, m.seq_id)
        if results not in seen:
            seen[results] = has_store_mark(results, store_location) is not False
        if not seen[results]:
            why = (
                f"{results} is not marked as an output folder of this store (a folder written by "
                f"an earlier version is marked by one --resume with --output "
                f"{results.rpartition('/')[0]})"
            )
            raise _refused(span, why)

    return check


class SpanWriter:
    """Writes, publishes, rolls forward and discards output spans under ``output``."""

    def __init__(self, output: str, *, per_token: bool, store_location: str | None = None) -> None:
        self.output = output
        self.per_token = per_token
        root = output.rstrip("/") + "/" + RESULTS_DIR
        self._fs = open_storage(root)
        self._made: set[str] = set()
        #: ``CheckpointStore.location`` of the store whose commits name these spans: output
        #: folders it marked are trusted besides this one (see `check`).
        self.store_location = store_location
        self._marked = False
        self._trusted: set[str] = {self._url(self._fs.root)}

    # -- which files a span may name -------------------------------------------------------
    def _ensure_marked(self) -> None:
        """Mark this output folder as one that jobs of the store write into (once)."""
        if self._marked or self.store_location is None:
            return
        body = json.dumps({"store": self.store_location}).encode("utf-8") + b"\n"
        self._fs.makedirs(self._fs.root)
        self._fs.write_immutable(self._fs.join(mark_name(self.store_location)), body)
        self._marked = True

    def check(self, span: OutputSpan, seq_id: str | None = None) -> bool:
        """`CorruptCheckpointError` unless ``span`` (read from a manifest: untrusted) names
        files of the form written here, in this job's results folder or in one that the
        store marked (see the module docstring).  False (nothing to touch: its outputs are
        lost) when its results folder does not exist at all, as after a user removed an old
        output folder."""
        results = results_folder_of(span, seq_id)
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
            raise _refused(span, why)
        self._trusted.add(results)
        return True

    # -- names ----------------------------------------------------------------------------
    def _url(self, path: str) -> str:
        if isinstance(self._fs, FsspecStorage):
            return f"{self._fs.protocol}://{path}"
        return path

    def _names(self, seq_id: str, first: int, end: int, commit: int | None) -> tuple[str, str]:
        folder = self._fs.join(encode_seq_dir(seq_id))
        final = f"{folder}/{first:012d}-{end:012d}.parquet"
        tag = "" if commit is None else f"{commit:020d}-"
        pending = f"{folder}/{_PENDING}{first:012d}-{end:012d}-{tag}{uuid.uuid4().hex[:12]}.parquet"
        return final, pending

    # -- the commit protocol --------------------------------------------------------------
    def write_pending(
        self, seq_id: str, results: list[ChunkResult], *, commit: int | None = None
    ) -> OutputSpan:
        """Step 1: the span of ``results`` (sorted, contiguous chunks) under a hidden name.

        ``commit``: the number of the commit that is to name the span.  It is part of the
        hidden name: the file belongs to that commit, and once the sequence's history holds
        that number (whoever created it) a job that restores the sequence may remove the file
        (see `remove_orphans`)."""
        span, writing = self.write_pending_async(seq_id, results, commit=commit)
        writing.result()
        return span

    def write_pending_async(
        self, seq_id: str, results: list[ChunkResult], *, commit: int | None = None
    ) -> tuple[OutputSpan, Any]:
        """`write_pending`, with the file written and made durable in a thread: the span, and
        the write (its ``result()`` returns once the file is durable, or raises)."""
        results = sorted(results, key=lambda r: int(r.index))
        first, end = int(results[0].index), int(results[-1].index) + 1
        if end - first != len(results):
            msg = f"sequence {seq_id!r}: outputs of chunks {first}..{end - 1} are not contiguous"
            raise ValueError(msg)
        sink = pa.BufferOutputStream()
        pq.write_table(spans_table(results, per_token=self.per_token), sink, use_dictionary=False)
        data = sink.getvalue()
        self._ensure_marked()
        final, pending = self._names(seq_id, first, end, commit)
        folder = final.rpartition("/")[0]
        if folder not in self._made:
            self._fs.makedirs(folder)
            self._made.add(folder)
        writing = in_thread(self._fs.write_immutable, pending, data)
        sha = hashlib.sha256(data).hexdigest()
        span = OutputSpan(
            self._url(final), self._url(pending), first, end, len(results), data.size, sha
        )
        return span, writing

    def publish(self, span: OutputSpan, *, written: bool = False) -> bool:
        """Step 3 (and the roll-forward): the final file exists with the span's bytes, the
        pending one is gone.  False when neither holds the span (outputs lost by hand).

        ``written``: the caller wrote the pending file itself and saw it made durable (a job
        publishing its own commit), so its bytes are not read back and hashed again; a
        roll-forward of a commit found in a store checks both files first.

        Safe against another job publishing the same span at the same time (a resumed job
        rolling this commit forward while its own job still publishes it): the final name is
        only ever replaced atomically by a file with the span's bytes, never removed first."""
        if not written and not self.check(span):
            return False  # its folder is gone: nothing holds the span
        fs, final = _storage_of(span.file)
        _, pending = _storage_of(span.pending)
        if not written:
            if _has_bytes(fs, final, span):
                fs.remove(pending)
                return True
            if not _has_bytes(fs, pending, span):
                return _has_bytes(fs, final, span)  # or another job published it meanwhile
        try:
            if isinstance(fs, LocalStorage):
                # A private hard link first: the bytes stay ours if the pending name goes.
                tmp = f"{pending}.{uuid.uuid4().hex[:12]}"
                os.link(pending, tmp)
                os.replace(tmp, final)  # atomic; replaces a damaged or foreign file
                # rename() does nothing when both names are links to one file already (another
                # job published it from the same pending file): the private link goes then.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                fs.sync_dir(final.rpartition("/")[0])
            else:
                fs.fs.copy(pending, final)  # one object: whole or absent
        except FileNotFoundError:  # another job moved the pending file on
            return _has_bytes(fs, final, span)
        fs.remove(pending)
        return True

    def remove_orphans(self, seq_id: str, *, up_to_commit: int) -> int:
        """Remove the sequence's hidden pending files in this output folder that belong to a
        commit numbered ``up_to_commit`` or lower: the sequence's history holds those numbers
        already (its newest commit, ``up_to_commit``, was rolled forward first), so each such
        file was published, or its writer lost that number or stopped before creating it.  A
        writer still working on one will find its number taken and discard its span anyway.

        Ownership alone decides, never a file's age: a writer paused for an hour, or one whose
        clock is off, keeps the pending file of the commit it is about to create (a higher
        number).  Files without a commit number (written before the number was in the name)
        are left alone."""
        folder = self._fs.join(encode_seq_dir(seq_id))
        removed = 0
        for name in self._fs.list_dir(folder):
            found = _PENDING_RE.fullmatch(name)
            if found is None or found.group(3) is None or int(found.group(3)) > up_to_commit:
                continue
            self._fs.remove(f"{folder}/{name}")
            removed += 1
        if removed:
            _log.info("removed %d unfinished output files of sequence %r", removed, seq_id)
        return removed

    def discard(self, span: OutputSpan) -> None:
        """A commit that did not happen: its pending file goes."""
        if not self.check(span):
            return
        fs, pending = _storage_of(span.pending)
        fs.remove(pending)

    def remove_published(self, span: OutputSpan) -> None:
        """The span of a commit that is being rolled back (its chunks are applied again)."""
        if not self.check(span):
            return
        fs, final = _storage_of(span.file)
        fs.remove(final)


def _storage_of(url: str) -> tuple[Any, str]:
    """(storage, path) for a file URL recorded in a manifest (local path or fsspec URL)."""
    folder, _, name = url.rpartition("/")
    storage = open_storage(folder)
    return storage, storage.join(name)


def _exists(folder: str) -> bool:
    try:
        fs = open_storage(folder)
        if isinstance(fs, LocalStorage):
            return os.path.lexists(fs.root)
        return bool(fs.fs.exists(fs.root))
    except (OSError, ValueError, ImportError):
        return True  # unknown: taken as there (and refused)


def _has_bytes(fs: Any, path: str, span: OutputSpan) -> bool:
    try:
        data = fs.read(path, span.size)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False
    return len(data) == span.size and hashlib.sha256(data).hexdigest() == span.sha256
