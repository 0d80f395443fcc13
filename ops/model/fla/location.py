"""Where a checkpoint folder lies: a local path, or a URL of any filesystem fsspec knows
(``gs://bucket/models/gla-1.3B/``, ``s3://``, ``memory://``; gcsfs or s3fs installed by the
``gcp`` / ``aws`` extras).  The loader asks it for the few files it reads; safetensors files are
mapped one tensor at a time from a local folder (`tensor_files.map_tensor`), opened as seekable
binary files and read one tensor at a time from a URL's.
"""

from __future__ import annotations

import os
from typing import IO, Any

__all__ = ["FolderLocation", "is_url"]


def is_url(source: str) -> bool:
    """Whether ``source`` names a remote location (``scheme://``; ``file://`` is local)."""
    return "://" in source and not source.startswith("file://")


class FolderLocation:
    """A checkpoint folder (``source``: what the user gave, used in messages)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._fs: Any = None
        if is_url(source):
            import fsspec

            self._fs, root = fsspec.core.url_to_fs(source)
            self.root = str(root).rstrip("/")
        else:
            self.root = source.removeprefix("file://")

    @property
    def is_local(self) -> bool:
        """Whether the folder is on this machine's filesystem (its files can be mapped)."""
        return self._fs is None

    def path(self, name: str) -> str:
        """The path (local, or in the URL's filesystem) of the folder's file ``name``."""
        if self._fs is None:
            return os.path.join(self.root, name)
        return f"{self.root}/{name}"

    def url(self, name: str) -> str:
        """What a user (or another process) opens file ``name`` by: a local path or a URL."""
        if self._fs is None:
            return self.path(name)
        return str(self._fs.unstrip_protocol(self.path(name)))

    def is_dir(self) -> bool:
        if self._fs is None:
            return os.path.isdir(self.root)
        return bool(self._fs.isdir(self.root))

    def is_file(self, name: str) -> bool:
        if self._fs is None:
            return os.path.isfile(self.path(name))
        return bool(self._fs.isfile(self.path(name)))

    def exists(self, name: str) -> bool:
        if self._fs is None:
            return os.path.exists(self.path(name))
        return bool(self._fs.exists(self.path(name)))

    def size(self, path: str) -> int:
        if self._fs is None:
            return os.path.getsize(path)
        return int(self._fs.size(path))

    def open(self, path: str) -> IO[bytes]:
        """A seekable binary file (``readinto`` works on both kinds)."""
        if self._fs is None:
            return open(path, "rb")
        return self._fs.open(path, "rb")

    def read_text(self, name: str) -> str:
        with self.open(self.path(name)) as f:
            return f.read().decode("utf-8")
