"""Safe, reversible names for sequence ids and the file names inside a sequence's folder.

A sequence id is any string.  Its folder name is ``q`` + the id with every byte outside
``[a-z0-9.-]`` written as ``_xx`` (lowercase hex of its UTF-8 bytes): no slashes, no ``..``, no
upper case (so case-insensitive stores cannot merge two ids), and reversible.  Ids whose name
would exceed 200 characters use ``h`` + the SHA-256 of the id; their id is read back from a
manifest.
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "COMMIT_SUFFIX",
    "MANIFEST_SUFFIX",
    "TMP_PREFIX",
    "commit_name",
    "data_name",
    "data_name_commit",
    "decode_seq_dir",
    "encode_seq_dir",
    "manifest_name",
    "parse_commit_name",
    "parse_data_name",
    "parse_manifest_name",
]

MANIFEST_SUFFIX = ".manifest.json"
#: Format-2 commits are named by their number in the sequence's chain of commits.
COMMIT_SUFFIX = ".commit.json"
DATA_SUFFIX = ".arrow"
TMP_PREFIX = ".tmp-"
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789.-")
_MAX_NAME = 200
_MANIFEST_RE = re.compile(r"([0-9]{20})\.manifest\.json")
_COMMIT_RE = re.compile(r"([0-9]{20})\.commit\.json")
_DATA_RE = re.compile(r"([0-9]{20})\.(?:([0-9]{20})\.)?([0-9a-f]{16})\.arrow")
_ESCAPED_RE = re.compile(r"q(?:[a-z0-9.-]|_[0-9a-f]{2})*")


def encode_seq_dir(seq_id: str) -> str:
    """The folder name of ``seq_id`` (see the module docstring)."""
    raw = seq_id.encode("utf-8")
    name = "q" + "".join(chr(b) if b in _SAFE else f"_{b:02x}" for b in raw)
    if len(name) > _MAX_NAME:
        return "h" + hashlib.sha256(raw).hexdigest()
    return name


def decode_seq_dir(name: str) -> str | None:
    """The sequence id of a ``q`` folder name; None for hashed (``h``) or foreign names."""
    if not _ESCAPED_RE.fullmatch(name):
        return None
    out = bytearray()
    i = 1
    while i < len(name):
        if name[i] == "_":
            out.append(int(name[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(name[i]))
            i += 1
    try:
        seq_id = out.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return seq_id if encode_seq_dir(seq_id) == name else None


def is_seq_dir(name: str) -> bool:
    """Whether ``name`` is a sequence folder's name (an encoded id, or a hashed one)."""
    return decode_seq_dir(name) is not None or is_hashed_seq_dir(name)


def is_hashed_seq_dir(name: str) -> bool:
    return len(name) == 65 and name[0] == "h" and all(c in "0123456789abcdef" for c in name[1:])


def manifest_name(position: int) -> str:
    return f"{position:020d}{MANIFEST_SUFFIX}"


def data_name(position: int, file_sha256: str, commit: int | None = None) -> str:
    """The data file of a commit at ``position`` whose bytes hash to ``file_sha256``.

    Format-2 commits name the commit number too: two writers' commits of one state at one
    position (a twin job, a late writer) then never share a file, so a writer that loses its
    commit can remove its own data file without removing the winner's.  Format 1 (and commits
    made before the number was in the name) used position and hash alone.
    """
    if commit is None:
        return f"{position:020d}.{file_sha256[:16]}{DATA_SUFFIX}"
    return f"{position:020d}.{commit:020d}.{file_sha256[:16]}{DATA_SUFFIX}"


def parse_manifest_name(name: str) -> int | None:
    m = _MANIFEST_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def parse_data_name(name: str) -> int | None:
    """The position in a data file name (None: not a data file name)."""
    m = _DATA_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def data_name_commit(name: str) -> int | None:
    """The commit number in a data file name (None: a name without one, or no data file)."""
    m = _DATA_RE.fullmatch(name)
    return int(m.group(2)) if m and m.group(2) else None


def commit_name(commit: int) -> str:
    """File name of commit number ``commit`` (1, 2, ...) of a sequence's chain (format 2)."""
    return f"{commit:020d}{COMMIT_SUFFIX}"


def parse_commit_name(name: str) -> int | None:
    m = _COMMIT_RE.fullmatch(name)
    return int(m.group(1)) if m else None
