"""Output spans in the per-sequence form of earlier versions: rolled forward, rolled back and
tidied by this version, never written.

Such a span is one commit's outputs of one sequence, ``<results>/<seq folder>/<first>-<end>
.parquet``, written first as ``.pending-<first>-<end>-[<commit>-]<random>.parquet`` beside it;
the manifest records the file's size and SHA-256.  A store written by an earlier version names
them in its commits; a job of this version that restores such a sequence publishes its newest
span if a crash stopped that, finds it lost if neither file holds its bytes, and writes the
sequence's later outputs in the group form (names.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import uuid
from typing import Any

from linstream.state import OutputSpan
from linstream.state.store import LocalStorage, encode_seq_dir, open_storage

from .names import LEGACY_PENDING_RE

__all__ = ["discard", "publish", "remove_orphans", "remove_published"]

_log = logging.getLogger(__name__)


def _storage_of(url: str) -> tuple[Any, str]:
    """(storage, path) for a file URL recorded in a manifest (local path or fsspec URL)."""
    folder, _, name = url.rpartition("/")
    storage = open_storage(folder)
    return storage, storage.join(name)


def _has_bytes(fs: Any, path: str, span: OutputSpan) -> bool:
    try:
        data = fs.read(path, span.size)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False
    return len(data) == span.size and hashlib.sha256(data).hexdigest() == span.sha256


def publish(span: OutputSpan) -> bool:
    """The final file exists with the span's bytes and the pending one is gone (a
    roll-forward); False when neither holds them.  The caller checked the span's names.

    Safe against another job publishing the same span at the same time: the final name is
    only ever replaced atomically by a file with the span's bytes, never removed first."""
    fs, final = _storage_of(span.file)
    _, pending = _storage_of(span.pending)
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
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            fs.sync_dir(final.rpartition("/")[0])
        else:
            fs.fs.copy(pending, final)  # one object: whole or absent
    except FileNotFoundError:  # another job moved the pending file on
        return _has_bytes(fs, final, span)
    fs.remove(pending)
    return True


def discard(span: OutputSpan) -> None:
    fs, pending = _storage_of(span.pending)
    fs.remove(pending)


def remove_published(span: OutputSpan) -> None:
    fs, final = _storage_of(span.file)
    fs.remove(final)


def remove_orphans(results: Any, seq_id: str, up_to_commit: int) -> int:
    """Remove the sequence's hidden pending files in its folder of ``results`` (a storage)
    that belong to a commit numbered ``up_to_commit`` or lower; files without a number are
    left alone (see `SpanWriter.remove_orphans`)."""
    folder = results.join(encode_seq_dir(seq_id))
    removed = 0
    for name in results.list_dir(folder):
        found = LEGACY_PENDING_RE.fullmatch(name)
        if found is None or found.group(3) is None or int(found.group(3)) > up_to_commit:
            continue
        results.remove(f"{folder}/{name}")
        removed += 1
    return removed
