"""The store's record of ``keep_every_tokens``: a small JSON file at the root, so that a later job
or ``linstream checkpoint gc`` not given ``--keep-every-tokens`` keeps the same history.

``ROOT/_linstream_retention.json`` holds ``{"format": 1, "keep_every_tokens": N}``.  It is written
whole through the store's storage (`Storage.replace`: a reader sees the old record or the new),
and read as untrusted input: bounded (`safe_json`), every field checked; a bad record is a
`CorruptCheckpointError` naming the file.  `settle` is the one rule every entry point follows:

* given None (the flag not given): the recorded N (0 when there is no record);
* given N: N, recorded when it differs from the record (``0`` given explicitly turns a recorded
  N off and records that; ``0`` with no record writes nothing).

Each outcome worth telling the user comes back as one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from linstream.state.errors import CorruptCheckpointError, NotARegularFileError, UnsafePathError

from .filesystems import FsspecStorage, LocalStorage
from .safe_json import loads_bounded

__all__ = ["MAX_RECORD_BYTES", "RECORD_NAME", "Settled", "read_keep_every", "settle"]

RECORD_NAME = "_linstream_retention.json"
#: A record is about 50 bytes; anything far larger is not one.
MAX_RECORD_BYTES = 4096
_FORMAT = 1
#: An int64 position bound: N above it keeps nothing a position could reach.
_MAX_EVERY = 2**63 - 1


@dataclass(frozen=True)
class Settled:
    """What ``settle`` decided: the N to keep by, and the line to tell the user (None: none)."""

    keep_every_tokens: int
    note: str | None


def record_path(fs: LocalStorage | FsspecStorage) -> str:
    return fs.join(RECORD_NAME)


def read_keep_every(fs: LocalStorage | FsspecStorage) -> int | None:
    """The recorded N, or None when the store has no record (CorruptCheckpointError when bad)."""
    path = record_path(fs)
    try:
        raw = fs.read(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except (UnsafePathError, NotARegularFileError) as ex:  # a link, FIFO, folder in its place
        msg = f"expected a retention record (a small JSON file): {ex.reason}"
        raise CorruptCheckpointError(msg, path=path) from ex
    except OSError as ex:  # unreadable
        msg = f"expected a retention record (a small JSON file): {ex}"
        raise CorruptCheckpointError(msg, path=path) from ex
    try:
        doc = loads_bounded(raw, max_bytes=MAX_RECORD_BYTES)
    except (ValueError, UnicodeDecodeError) as ex:  # JSONDecodeError and UnsafeJSONError too
        msg = f"expected a retention record (JSON, at most {MAX_RECORD_BYTES} bytes): {ex}"
        raise CorruptCheckpointError(msg, path=path) from ex
    expected = {"format", "keep_every_tokens"}
    if not isinstance(doc, dict) or set(doc) != expected:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        msg = f"expected a retention record with keys {sorted(expected)}, found {got}"
        raise CorruptCheckpointError(msg, path=path)
    if doc["format"] != _FORMAT or isinstance(doc["format"], bool):
        msg = f"expected retention record format {_FORMAT}, found {doc['format']!r}"
        raise CorruptCheckpointError(msg, path=path)
    n = doc["keep_every_tokens"]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= _MAX_EVERY:
        msg = f"expected keep_every_tokens a whole number from 0 to {_MAX_EVERY}, found {n!r}"
        raise CorruptCheckpointError(msg, path=path)
    return n


def _write(fs: LocalStorage | FsspecStorage, n: int) -> None:
    fs.makedirs(fs.root)
    doc = {"format": _FORMAT, "keep_every_tokens": n}
    fs.replace(record_path(fs), json.dumps(doc).encode() + b"\n")


def settle(fs: LocalStorage | FsspecStorage, given: int | None) -> Settled:
    """The N a job or gc keeps by, given ``--keep-every-tokens`` (None: not given); records a
    new N (see the module docstring)."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 0):
        msg = f"keep_every_tokens: expected a whole number >= 0 or None, received {given!r}"
        raise ValueError(msg)
    recorded = read_keep_every(fs)
    path = record_path(fs)
    if given is None:
        n = recorded or 0
        note = None
        if n:
            note = f"keeping every {n:,} tokens' first commit, as recorded in {path}"
        return Settled(n, note)
    if given == (recorded or 0):
        return Settled(given, None)
    _write(fs, given)
    if given == 0:
        note = f"no longer keeping every {recorded:,} tokens' commits (recorded in {path})"
    elif recorded:
        note = (
            f"now keeping every {given:,} tokens' first commit, was {recorded:,} "
            f"(recorded in {path})"
        )
    else:
        note = (
            f"keeping every {given:,} tokens' first commit (recorded in {path}: later jobs and "
            "gc keep it without the flag)"
        )
    return Settled(given, note)
