"""Looking over a whole checkpoint store: its sequences and commits, verification of every
commit, and garbage collection of orphan data files and stale temporaries.

`Listing` is the part of the store that does this; it is handed the store's folders, its
restorer (verify runs every restore check) and its retention (gc prunes too)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from linstream.state.errors import CheckpointError

from .folders import StoreFolders
from .paths import TMP_PREFIX, decode_seq_dir, encode_seq_dir, parse_data_name
from .restore import ManifestCheck, Restorer, run_check
from .retention import Retention
from .types import CheckpointProblem, CommitInfo

__all__ = ["Listing"]

log = logging.getLogger("linstream.state")


class Listing:
    """``sequences``, ``commits``, ``verify``, ``orphans`` and ``collect`` (the removals of
    ``CheckpointStore.gc``); ``clock``: seconds since the epoch (injected by tests)."""

    def __init__(
        self,
        folders: StoreFolders,
        restorer: Restorer,
        retention: Retention,
        clock: Callable[[], float],
    ) -> None:
        self.folders, self.restorer, self.retention, self.clock = (
            folders,
            restorer,
            retention,
            clock,
        )

    def sequences(self) -> list[str]:
        """Ids of the sequences that have at least one commit (readable or not), sorted."""
        out = []
        for name in self.folders.seq_dirs():
            try:
                files = self.folders.commit_files(self.folders.fs.join(name))
            except CheckpointError:  # unlistable (a link): listed if its name gives the id
                files = []
                if decode_seq_dir(name) is not None:
                    out.append(str(decode_seq_dir(name)))
            if not files:
                continue
            seq_id = decode_seq_dir(name)
            if seq_id is None:  # hashed name: the id is in the manifests
                for path, n, pos in files:
                    try:
                        seq_id = self.folders.parse_commit(path, n, pos).seq_id
                        break
                    except (CheckpointError, FileNotFoundError):
                        continue
            if seq_id is not None and encode_seq_dir(seq_id) == name:
                out.append(seq_id)
        return sorted(out)

    def commits(self, seq_id: str) -> list[CommitInfo]:
        """The commits of ``seq_id`` as their manifests describe them, newest first."""
        return self._commits_in(self.folders.seq_dir(seq_id), seq_id)

    def _commits_in(self, seq_dir: str, seq_id: str | None) -> list[CommitInfo]:
        out = []
        for path, n, pos in self.folders.commit_files(seq_dir):
            try:
                m = self.folders.parse_commit(path, n, pos)
            except (CheckpointError, FileNotFoundError) as ex:
                where = -1 if pos is None else pos
                out.append(CommitInfo(seq_id, where, path, None, None, None, None, str(ex), n))
                continue
            out.append(
                CommitInfo(
                    m.seq_id,
                    m.position,
                    path,
                    f"{seq_dir}/{m.data_file}",
                    m.size,
                    m.next_chunk,
                    m.fingerprint,
                    None,
                    n,
                )
            )
        return out

    def verify(self, check: ManifestCheck | None = None) -> list[CheckpointProblem]:
        """Run every restore check (except the expected fingerprint) on every commit, and
        ``check`` (see ``head``) on every manifest that can be parsed, whether or not its data
        file passes (a commit can have two problems)."""
        problems = []
        for name in self.folders.seq_dirs():
            seq_dir = self.folders.fs.join(name)
            try:
                files = self.folders.commit_files(seq_dir)
            except CheckpointError as ex:  # e.g. a sequence folder that is a symbolic link
                problems.append(CheckpointProblem(ex.path or seq_dir, ex.reason, type(ex).__name__))
                continue
            for path, n, pos in files:
                try:
                    self.restorer.load_file(path, n, pos, None, None)
                except CheckpointError as ex:
                    problems.append(
                        CheckpointProblem(ex.path or path, ex.reason, type(ex).__name__)
                    )
                if check is None:
                    continue
                try:
                    m = self.folders.parse_commit(path, n, pos)
                except (CheckpointError, FileNotFoundError):
                    continue  # reported by the load above
                try:
                    run_check(check, m, path)
                except CheckpointError as ex:
                    problems.append(CheckpointProblem(path, ex.reason, type(ex).__name__))
        return problems

    def orphans(self) -> list[str]:
        """Data files that no manifest names (a crash before the commit, or a lost race)."""
        return [path for path, _ in self.orphan_files()]

    def orphan_files(self) -> list[tuple[str, str]]:
        """(path, name) of every orphan data file and stale temporary."""
        out = []
        for name in self.folders.seq_dirs():
            seq_dir = self.folders.fs.join(name)
            try:
                names = self.folders.fs.list_dir(seq_dir)
            except CheckpointError as ex:  # a linked folder: nothing in it is ours to delete
                log.warning("checkpoint gc skips %s: %s", seq_dir, ex)
                continue
            referenced: set[str] = set()
            unreadable: set[int] = set()
            any_unreadable_chain = False
            for path, number, at in self.folders.commit_files(seq_dir, names):
                try:
                    referenced.add(self.folders.parse_commit(path, number, at).data_file)
                except (CheckpointError, FileNotFoundError):
                    # Keep the data files it may name: its position's (format 1), or all of
                    # them (an unreadable format-2 commit does not say its position).
                    if at is not None:
                        unreadable.add(at)
                    else:
                        any_unreadable_chain = True
            for n in names:
                if n.startswith(TMP_PREFIX):
                    out.append((f"{seq_dir}/{n}", n))
                    continue
                pos = parse_data_name(n)
                if (
                    pos is not None
                    and n not in referenced
                    and pos not in unreadable
                    and not any_unreadable_chain
                ):
                    out.append((f"{seq_dir}/{n}", n))
        return out

    def collect(self, grace_seconds: float) -> list[str]:
        """Remove orphan data files and stale temporaries older than ``grace_seconds``, and
        commits beyond ``keep`` (see ``CheckpointStore.gc``).  Returns the removed paths."""
        now = self.clock()
        removed = []
        for path, _ in self.orphan_files():
            mtime = self.folders.fs.mtime(path)
            if mtime is not None and now - mtime >= grace_seconds:
                self.folders.fs.remove(path)
                removed.append(path)
        for name in self.folders.seq_dirs():
            try:
                removed.extend(self.retention.prune(self.folders.fs.join(name)))
            except CheckpointError as ex:
                log.warning("checkpoint gc skips %s: %s", name, ex)
        return removed
