"""Looking over a whole checkpoint store: its sequences and commits, verification of every
commit, and garbage collection of orphan data files and stale temporaries."""

from __future__ import annotations

import logging
from collections.abc import Callable

from linstream.state.errors import CheckpointError

from .paths import TMP_PREFIX, decode_seq_dir, encode_seq_dir, parse_data_name
from .restore import ManifestCheck, StoreRestore, run_check
from .retention import StoreRetention
from .types import CheckpointProblem, CommitInfo

__all__ = ["StoreListing"]

log = logging.getLogger("linstream.state")


class StoreListing(StoreRestore, StoreRetention):
    """``sequences``, ``commits``, ``verify``, ``orphans`` and ``gc``."""

    _clock: Callable[[], float]

    def sequences(self) -> list[str]:
        """Ids of the sequences that have at least one commit (readable or not), sorted."""
        out = []
        for name in self._seq_dirs():
            try:
                files = self._commit_files(self._fs.join(name))
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
                        seq_id = self._parse_commit(path, n, pos).seq_id
                        break
                    except (CheckpointError, FileNotFoundError):
                        continue
            if seq_id is not None and encode_seq_dir(seq_id) == name:
                out.append(seq_id)
        return sorted(out)

    def commits(self, seq_id: str) -> list[CommitInfo]:
        """The commits of ``seq_id`` as their manifests describe them, newest first."""
        return self._commits_in(self._seq_dir(seq_id), seq_id)

    def _commits_in(self, seq_dir: str, seq_id: str | None) -> list[CommitInfo]:
        out = []
        for path, n, pos in self._commit_files(seq_dir):
            try:
                m = self._parse_commit(path, n, pos)
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
        for name in self._seq_dirs():
            seq_dir = self._fs.join(name)
            try:
                files = self._commit_files(seq_dir)
            except CheckpointError as ex:  # e.g. a sequence folder that is a symbolic link
                problems.append(CheckpointProblem(ex.path or seq_dir, ex.reason, type(ex).__name__))
                continue
            for path, n, pos in files:
                try:
                    self._load_file(path, n, pos, None, None)
                except CheckpointError as ex:
                    problems.append(
                        CheckpointProblem(ex.path or path, ex.reason, type(ex).__name__)
                    )
                if check is None:
                    continue
                try:
                    m = self._parse_commit(path, n, pos)
                except (CheckpointError, FileNotFoundError):
                    continue  # reported by the load above
                try:
                    run_check(check, m, path)
                except CheckpointError as ex:
                    problems.append(CheckpointProblem(path, ex.reason, type(ex).__name__))
        return problems

    def orphans(self) -> list[str]:
        """Data files that no manifest names (a crash before the commit, or a lost race)."""
        return [path for path, _ in self._orphans()]

    def _orphans(self) -> list[tuple[str, str]]:
        out = []
        for name in self._seq_dirs():
            seq_dir = self._fs.join(name)
            try:
                names = self._fs.list_dir(seq_dir)
            except CheckpointError as ex:  # a linked folder: nothing in it is ours to delete
                log.warning("checkpoint gc skips %s: %s", seq_dir, ex)
                continue
            referenced: set[str] = set()
            unreadable: set[int] = set()
            any_unreadable_chain = False
            for path, number, at in self._commit_files(seq_dir, names):
                try:
                    referenced.add(self._parse_commit(path, number, at).data_file)
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

    def gc(self, grace_seconds: float = 3600.0) -> list[str]:
        """Remove orphan data files and stale temporaries older than ``grace_seconds``, and
        commits beyond ``keep``.  Returns the removed paths.

        The grace period protects commits in flight (their data file exists before their
        manifest); make it longer than any commit can take.
        """
        self.flush()
        now = self._clock()
        removed = []
        for path, _ in self._orphans():
            mtime = self._fs.mtime(path)
            if mtime is not None and now - mtime >= grace_seconds:
                self._fs.remove(path)
                removed.append(path)
        for name in self._seq_dirs():
            try:
                removed.extend(self._prune(self._fs.join(name)))
            except CheckpointError as ex:
                log.warning("checkpoint gc skips %s: %s", name, ex)
        if removed:
            log.info("checkpoint gc under %s removed %d files", self.root, len(removed))
        return removed
