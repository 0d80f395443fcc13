"""The names of output files, and the check that a manifest's output span names only those.

A results folder (``<output>/results``) holds, in the form this version writes:

    part-<group>-<k:04d>.parquet        a published file of output group <group> (16 hex digits:
                                        one group per bundle, or per GROUP_BYTES of results);
                                        k = 0, 1, ... (a file more only when another job
                                        published part of the group at the same time)
    .pending-<group>-<seq key>-<first:012d>-<end:012d>-<commit:020d>.parquet
                                        the hidden outputs of chunks first..end-1 of one
                                        sequence (<seq key>: 16 hex digits of the SHA-256 of
                                        its id), written before commit <commit> names them
    .linstream-store-<hash>             the mark of a checkpoint store whose jobs write here

and, written by earlier versions (read, rolled forward and tidied, never written):

    <seq folder>/<first:012d>-<end:012d>.parquet     one commit's outputs of one sequence
    <seq folder>/.pending-<first>-<end>-[<commit>-]<random>.parquet

A manifest is untrusted input, and so are the names its output span records.  Before any file
a span names is read, published or removed, `results_folder_of` confirms that both names have
exactly one of these forms (for the manifest's own sequence) and that the results folder is an
absolute ``…/results``; `SpanWriter.check` (spans.py) adds that the folder is this job's own or
one that a job of the same checkpoint store marked.  A span naming anything else is refused
(`CorruptCheckpointError`), and nothing it names is touched.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass

from linstream.state import CorruptCheckpointError, OutputSpan
from linstream.state.store import LocalStorage, Manifest, encode_seq_dir, is_seq_dir, open_storage

__all__ = [
    "RESULTS_DIR",
    "Pending",
    "SpanPlace",
    "group_file",
    "has_store_mark",
    "mark_name",
    "member_index",
    "member_name",
    "new_group_id",
    "parse_pending",
    "pending_name",
    "results_folder_of",
    "seq_key",
    "span_check",
    "span_place",
]

#: Sub-folder of a job's output folder that holds the result files.
RESULTS_DIR = "results"
LEGACY_PENDING = ".pending-"
LEGACY_PENDING_RE = re.compile(
    r"\.pending-([0-9]{12})-([0-9]{12})-(?:([0-9]{20})-)?[0-9a-f]{12}\.parquet"
)
_PENDING_RE = re.compile(
    r"\.pending-([0-9a-f]{16})-([0-9a-f]{16})-([0-9]{12})-([0-9]{12})-([0-9]{20})\.parquet"
)
_GROUP_FILE_RE = re.compile(r"part-([0-9a-f]{16})\.parquet")
_MEMBER_RE = re.compile(r"part-([0-9a-f]{16})-([0-9]{4,9})\.parquet")
_SCHEME_RE = re.compile(r"([a-z][a-z0-9+.-]*)://")
_MARK = ".linstream-store-"


def new_group_id() -> str:
    return os.urandom(8).hex()


def seq_key(seq_id: str) -> str:
    """16 hex digits naming a sequence in a pending file's name (its id is in the rows)."""
    return hashlib.sha256(seq_id.encode("utf-8")).hexdigest()[:16]


def group_file(group: str) -> str:
    """What a manifest records as a group's published file: the name its files share."""
    return f"part-{group}.parquet"


def member_name(group: str, k: int) -> str:
    return f"part-{group}-{k:04d}.parquet"


def member_index(name: str, group: str) -> int | None:
    """k when ``name`` is file k of ``group``, else None."""
    m = _MEMBER_RE.fullmatch(name)
    return int(m.group(2)) if m and m.group(1) == group else None


def pending_name(group: str, seq_id: str, first: int, end: int, commit: int) -> str:
    return f".pending-{group}-{seq_key(seq_id)}-{first:012d}-{end:012d}-{commit:020d}.parquet"


@dataclass(frozen=True)
class Pending:
    """What a pending file's name says: its group, sequence key, chunks and commit number."""

    group: str
    key: str
    first: int
    end: int
    commit: int


def parse_pending(name: str) -> Pending | None:
    m = _PENDING_RE.fullmatch(name)
    if m is None:
        return None
    return Pending(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)))


def mark_name(store_location: str) -> str:
    """The hidden file in a results folder that says jobs of the store at ``store_location``
    (``CheckpointStore.location``) write their outputs there."""
    return _MARK + hashlib.sha256(store_location.encode("utf-8")).hexdigest()[:32]


def refused(span: OutputSpan, why: str) -> CorruptCheckpointError:
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


@dataclass(frozen=True)
class SpanPlace:
    """Where a checked span's files are: its results folder and, for the group form, its
    group (None: a per-sequence span of an earlier version)."""

    results: str
    group: str | None


def _legacy_place(span: OutputSpan, seq_id: str | None) -> str:
    folder, _, name = span.file.rpartition("/")
    pfolder, _, pname = span.pending.rpartition("/")
    results, _, seq_dir = folder.rpartition("/")
    want = f"{span.first_chunk:012d}-{span.end_chunk:012d}.parquet"
    pending = LEGACY_PENDING_RE.fullmatch(pname)
    if name != want or pending is None or pending.group(1, 2) != tuple(want[:-8].split("-")):
        raise refused(span, f"expected the files {want} and {LEGACY_PENDING}{want[:-8]}-….parquet")
    if pfolder != folder:
        raise refused(span, "its pending file is in another folder than its result file")
    expected_dir = None if seq_id is None else encode_seq_dir(seq_id)
    if (expected_dir is not None and seq_dir != expected_dir) or not (is_seq_dir(seq_dir)):
        want_dir = expected_dir or "a sequence folder"
        raise refused(span, f"expected them in {want_dir}, found folder {seq_dir!r:.80}")
    return results


def span_place(span: OutputSpan, seq_id: str | None = None) -> SpanPlace:
    """Where the span's files are, checking that they have exactly a form linstream writes
    (see the module docstring), for ``seq_id`` when given; else `CorruptCheckpointError`
    saying what is wrong."""
    folder, _, name = span.file.rpartition("/")
    group = _GROUP_FILE_RE.fullmatch(name)
    if group is None:
        results = _legacy_place(span, seq_id)
        place = SpanPlace(results, None)
    else:
        pfolder, _, pname = span.pending.rpartition("/")
        pending = parse_pending(pname)
        if pending is None or pending.group != group.group(1):
            raise refused(span, f"expected its pending file as .pending-{group.group(1)}-….parquet")
        if pfolder != folder:
            raise refused(span, "its pending file is in another folder than its result file")
        if seq_id is not None and pending.key != seq_key(seq_id):
            raise refused(span, "its pending file is named for another sequence")
        if not (span.first_chunk <= pending.first < pending.end <= span.end_chunk):
            raise refused(
                span, f"its pending file's chunks lie outside {span.first_chunk}..{span.end_chunk}"
            )
        place = SpanPlace(folder, group.group(1))
    if place.results.rpartition("/")[2] != RESULTS_DIR or not _normal_folder(place.results):
        raise refused(span, f"expected an absolute <output>/{RESULTS_DIR}/ folder")
    return place


def results_folder_of(span: OutputSpan, seq_id: str | None = None) -> str:
    """The results folder (``<output>/results``, as a path or URL) of the span's files (see
    `span_place`)."""
    return span_place(span, seq_id).results


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


def unmarked(span: OutputSpan, results: str) -> CorruptCheckpointError:
    why = (
        f"{results} is not marked as an output folder of this store (a folder written by an "
        f"earlier version is marked by one --resume with --output {results.rpartition('/')[0]})"
    )
    return refused(span, why)


def span_check(store_location: str) -> Callable[[Manifest], None]:
    """A manifest check (for ``CheckpointStore.verify``): the output span a commit names, if
    any, is in a form linstream writes and in a results folder marked by this store."""
    seen: dict[str, bool] = {}

    def check(m: Manifest) -> None:
        span = None if m.history is None else m.history.outputs
        if span is None:
            return
        results = results_folder_of(span, m.seq_id)
        if results not in seen:
            seen[results] = has_store_mark(results, store_location) is not False
        if not seen[results]:
            raise unmarked(span, results)

    return check
