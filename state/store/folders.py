"""Where a checkpoint store keeps things: its storage, the sequence folders, the commit files in
them and their manifests.

`StoreFolders` is the part of the store every other part is handed (restore, commit, retention,
listing): it finds and parses a sequence's commit files, makes its folder, and keeps the list of
folders whose new entries still wait for an fsync (``sync_batch``; `Committer.sync` makes them
durable).
"""

from __future__ import annotations

from linstream.state.errors import CorruptCheckpointError

from .filesystems import FsspecStorage, LocalStorage
from .manifest import MAX_MANIFEST_BYTES, Manifest
from .paths import (
    commit_name,
    encode_seq_dir,
    is_seq_dir,
    manifest_name,
    parse_commit_name,
    parse_manifest_name,
)

__all__ = ["CommitFile", "StoreFolders"]

#: A commit file: (path, chain number (format 2) or None, position (format 1) or None).
CommitFile = tuple[str, int | None, int | None]


class StoreFolders:
    """Paths and commit files under the storage's root.

    sync_batch (local disk only; 0 elsewhere): when set, the fsync of a new folder entry (a
    commit's names, a new sequence folder) waits in ``unsynced`` for `Committer.sync`.
    """

    def __init__(self, fs: LocalStorage | FsspecStorage, *, sync_batch: int = 0) -> None:
        self.fs = fs
        self.sync_batch = max(0, int(sync_batch)) if isinstance(fs, LocalStorage) else 0
        #: Folders whose new entries are not durable yet (those commits' own and the root).
        self.unsynced: set[str] = set()
        self._dirs_made: set[str] = set()
        self._root_synced = False

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalStorage)

    def seq_dir(self, seq_id: str) -> str:
        return self.fs.join(encode_seq_dir(seq_id))

    def ensure_dir(self, seq_dir: str) -> None:
        """Make the sequence's folder (once per store), its name durable (at once, or with the
        next sync when ``sync_batch`` is set)."""
        if seq_dir in self._dirs_made:
            return
        fs = self.fs
        if not fs.is_dir(seq_dir):
            fs.makedirs(seq_dir)
            if isinstance(fs, LocalStorage) and self.sync_batch:
                self.unsynced.add(fs.root)  # durable with the commit made in it
                if not self._root_synced:
                    self.unsynced.add(fs.root.rpartition("/")[0] or "/")
                    self._root_synced = True
            elif isinstance(fs, LocalStorage):  # make the new folder's name durable
                fs.sync_dir(fs.root)
                if not self._root_synced:  # and the root's (makedirs may have made it): once
                    fs.sync_dir(fs.root.rpartition("/")[0] or "/")
                    self._root_synced = True
        self._dirs_made.add(seq_dir)

    def commit_files(self, seq_dir: str, names: list[str] | None = None) -> list[CommitFile]:
        """Every commit file as (path, chain number, format-1 position), newest first: the
        chain (format 2) by number, then format-1 manifests by position."""
        names = self.fs.list_dir(seq_dir) if names is None else names
        chain = sorted((n for n in map(parse_commit_name, names) if n is not None), reverse=True)
        old = sorted((p for p in map(parse_manifest_name, names) if p is not None), reverse=True)
        return [(self.commit_path(seq_dir, n), n, None) for n in chain] + [
            (self.manifest_path(seq_dir, p), None, p) for p in old
        ]

    def parse_commit(self, path: str, number: int | None, position: int | None) -> Manifest:
        """Read and check one commit file (format 2 when ``number`` is given)."""
        m = Manifest.parse(self.fs.read(path, MAX_MANIFEST_BYTES), path=path, position=position)
        if number is not None and (m.history is None or m.history.commit != number):
            got = None if m.history is None else m.history.commit
            msg = f"manifest records commit {got}, but its name says {number}"
            raise CorruptCheckpointError(msg, path=path)
        return m

    def read_manifest_if_any(self, mpath: str, position: int | None) -> Manifest | None:
        try:
            raw = self.fs.read(mpath, MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return None
        return Manifest.parse(raw, path=mpath, position=position)

    def manifest_path(self, seq_dir: str, position: int) -> str:
        """A format-1 commit's manifest."""
        return f"{seq_dir}/{manifest_name(position)}"

    def commit_path(self, seq_dir: str, commit: int) -> str:
        return f"{seq_dir}/{commit_name(commit)}"

    def seq_dirs(self) -> list[str]:
        """The names of the sequence folders under the root."""
        return [n for n in self.fs.list_dir(self.fs.root) if is_seq_dir(n)]

    def vanished(self, seq_dir: str, number: int) -> int | None:
        """None while commit ``number`` is in the folder; once it is not (retention removed
        it, or it never was), the highest commit number there (0: none)."""
        names = self.fs.list_dir(seq_dir)
        if commit_name(number) in names:
            return None
        return max((n for n in map(parse_commit_name, names) if n is not None), default=0)
