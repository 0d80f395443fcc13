"""Where a checkpoint store keeps things: sequence folders, commit file names, manifest reads.

The base of ``CheckpointStore``: the parts every other part of the store (commit, restore,
retention, listing) uses to find and parse a sequence's commit files.
"""

from __future__ import annotations

from linstream.state.errors import CorruptCheckpointError

from .filesystems import FsspecStorage, LocalStorage
from .manifest import MAX_MANIFEST_BYTES, Manifest
from .paths import (
    commit_name,
    decode_seq_dir,
    encode_seq_dir,
    is_hashed_seq_dir,
    manifest_name,
    parse_commit_name,
    parse_manifest_name,
)

__all__ = ["StoreLayout"]


class StoreLayout:
    """Paths and commit files under ``root`` (the attributes are set by ``CheckpointStore``)."""

    root: str
    keep: int
    _fs: LocalStorage | FsspecStorage
    _dirs_made: set[str]
    _root_synced: bool
    #: Commits whose folder entries wait for ``CheckpointStore.sync`` (0: none ever wait).
    sync_batch: int
    #: Folders whose new entries are not durable yet (those commits' own and the root).
    _unsynced: set[str]

    def _seq_dir(self, seq_id: str) -> str:
        return self._fs.join(encode_seq_dir(seq_id))

    def _ensure_dir(self, seq_dir: str) -> None:
        if seq_dir in self._dirs_made:
            return
        if not self._fs.is_dir(seq_dir):
            self._fs.makedirs(seq_dir)
            if isinstance(self._fs, LocalStorage) and self.sync_batch:
                self._unsynced.add(self._fs.root)  # durable with the commit made in it
                if not self._root_synced:
                    self._unsynced.add(self._fs.root.rpartition("/")[0] or "/")
                    self._root_synced = True
            elif isinstance(self._fs, LocalStorage):  # make the new folder's name durable
                self._fs.sync_dir(self._fs.root)
                if not self._root_synced:  # and the root's (makedirs may have made it): once
                    self._fs.sync_dir(self._fs.root.rpartition("/")[0] or "/")
                    self._root_synced = True
        self._dirs_made.add(seq_dir)

    def _positions(self, seq_dir: str) -> list[int]:
        """Positions of format-1 commits (manifest names), newest first."""
        found = (parse_manifest_name(n) for n in self._fs.list_dir(seq_dir))
        return sorted((p for p in found if p is not None), reverse=True)

    def _commit_files(
        self, seq_dir: str, names: list[str] | None = None
    ) -> list[tuple[str, int | None, int | None]]:
        """Every commit file as (path, chain number, format-1 position), newest first: the
        chain (format 2) by number, then format-1 manifests by position."""
        names = self._fs.list_dir(seq_dir) if names is None else names
        chain = sorted((n for n in map(parse_commit_name, names) if n is not None), reverse=True)
        old = sorted((p for p in map(parse_manifest_name, names) if p is not None), reverse=True)
        return [(self._cpath(seq_dir, n), n, None) for n in chain] + [
            (self._mpath(seq_dir, p), None, p) for p in old
        ]

    def _parse_commit(self, path: str, number: int | None, position: int | None) -> Manifest:
        """Read and check one commit file (format 2 when ``number`` is given)."""
        m = Manifest.parse(self._fs.read(path, MAX_MANIFEST_BYTES), path=path, position=position)
        if number is not None and (m.history is None or m.history.commit != number):
            got = None if m.history is None else m.history.commit
            msg = f"manifest records commit {got}, but its name says {number}"
            raise CorruptCheckpointError(msg, path=path)
        return m

    def _read_manifest_if_any(self, mpath: str, position: int | None) -> Manifest | None:
        try:
            raw = self._fs.read(mpath, MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return None
        return Manifest.parse(raw, path=mpath, position=position)

    def _mpath(self, seq_dir: str, position: int) -> str:
        return f"{seq_dir}/{manifest_name(position)}"

    def _cpath(self, seq_dir: str, commit: int) -> str:
        return f"{seq_dir}/{commit_name(commit)}"

    def _seq_dirs(self) -> list[str]:
        return [
            n
            for n in self._fs.list_dir(self._fs.root)
            if decode_seq_dir(n) is not None or is_hashed_seq_dir(n)
        ]
