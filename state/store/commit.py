"""Committing to a checkpoint store: `Committer`, the part of the store that writes commits.

A commit is the create-if-absent creation of the next commit file of a sequence's chain (see
checkpoint_store.py for the layout): when another writer took the number, the commit concludes
what is there (a duplicate, a state equal within tolerance, or another history:
``SupersededError`` / ``DivergentStateError``).  With ``sync_batch`` the fsyncs of the commits'
folders wait for `sync`, which makes many of them durable at once.  The committer is handed the
store's folders, its restorer (to read a commit back), its retention (scheduled after each
commit) and its counters.

(About 330 lines: the commit and every check around it, in the order they are made.)
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from linstream.state.codec import encode_checked, format_versions, tensor_ranges
from linstream.state.errors import (
    CheckpointError,
    DivergentStateError,
    NonFiniteStateError,
    SupersededError,
)
from linstream.state.sequence_state import SequenceState

from .filesystems import LocalStorage, in_thread
from .folders import StoreFolders
from .manifest import History, Manifest, split_file_hash
from .paths import data_name, parse_commit_name
from .restore import Restorer, moved_on
from .retention import Retention
from .types import NO_HISTORY, CommitOutcome

__all__ = ["DEFAULT_RTOL", "Committer"]

log = logging.getLogger("linstream.state")

#: Default relative tolerance (on the max-abs scale of each tensor) for "equal within tolerance".
DEFAULT_RTOL = {"float64": 1e-5, "float32": 1e-3}


def _max_rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if b.size else 0.0
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def _shape(st: SequenceState) -> str:
    """S's shape (a state of S and z), or every tensor's."""
    if st.classic:
        return str(list(st.S.shape))
    return ", ".join(f"{n} {list(s)}" for n, s in st.layout)


class Committer:
    """Writes commits (`commit`) and makes their folders durable (`sync`, `sync_seq`).

    rtol: tolerance of "equal within tolerance" as a fraction of each tensor's largest magnitude
    (None: ``DEFAULT_RTOL`` by dtype).  ``counters`` counts the outcomes.
    """

    def __init__(
        self,
        folders: StoreFolders,
        restorer: Restorer,
        retention: Retention,
        counters: dict[str, int],
        *,
        rtol: float | None = None,
    ) -> None:
        self.folders, self.restorer, self.retention = folders, restorer, retention
        self.counters, self.rtol = counters, rtol
        self._unsynced_commits: list[str] = []  # their folders, retention after the sync

    def commit(
        self,
        st: SequenceState,
        history: History | None = None,
        *,
        ready: Callable[[], object] | None = None,
    ) -> CommitOutcome:
        """Commit ``st`` durably as commit ``history.commit`` of its chain; see the module
        docstring for the outcomes.

        Without ``history`` the commit continues the newest commit whose position is below
        ``st.position`` (or, when a commit at ``st.position`` exists, retries it), with no
        final chunk and no chunk digests recorded.  Raises ``NonFiniteStateError`` (NaN/Inf,
        nothing written), ``SupersededError`` (the commit number holds another history, or it
        was taken and then removed by retention: the history moved on past it),
        ``DivergentStateError`` (another state at this position), ``CorruptCheckpointError``
        (the commit already there cannot be read to compare).  ``ready``, when given, returns
        once the other files the history names (its output span) are durable; it is called
        before the commit is created, so their writing overlaps this commit's own.
        """
        folders, fs = self.folders, self.folders.fs
        if not isinstance(st, SequenceState):
            msg = f"commit: expected a SequenceState, received {type(st).__name__}"
            raise TypeError(msg)
        if not st.is_finite():
            msg = (
                f"sequence {st.seq_id!r} at position {st.position}: expected finite S and z, "
                "received NaN or Inf; refusing to commit"
            )
            raise NonFiniteStateError(msg)
        buf, digest = encode_checked(st, finite_checked=True)
        # Computed here, not in ``prepare``: the manifest must be written as early as possible
        # while the data file's fsync runs (so that one journal commit can carry both).
        ranges = tensor_ranges(buf, st)
        split = None if ranges is None else split_file_hash(buf, ranges, digest)
        seq_dir = folders.seq_dir(st.seq_id)
        if history is None:
            history = self._auto_history(seq_dir, st)
        mpath = folders.commit_path(seq_dir, history.commit)

        version, min_reader = format_versions(st)

        def manifest_for(sha: str) -> Manifest:
            return Manifest(
                format_version=version,
                min_reader_version=min_reader,
                seq_id=st.seq_id,
                position=st.position,
                next_chunk=st.next_chunk,
                fingerprint=st.fingerprint,
                dtype=str(st.dtype),
                shape=st.state_shape,
                data_file=data_name(st.position, sha, history.commit),
                size=buf.size,
                sha256=sha,
                digest=digest,
                tensor_ranges=ranges,
                split_sha256=split,
                history=history,
            )

        made: list[Manifest] = []

        def prepare(sha: str) -> tuple[str, bytes]:
            made.append(manifest_for(sha))
            return f"{seq_dir}/{made[0].data_file}", made[0].to_bytes()

        existing = folders.read_manifest_if_any(mpath, None)
        if existing is None:
            folders.ensure_dir(seq_dir)
            batch = folders.sync_batch > 0
            if batch:  # whatever the outcome: another writer's commit there is synced too
                folders.unsynced.add(seq_dir)
                made_it = fs.commit_files(buf, mpath, prepare, ready, sync_folder=False)
            elif ready is None:
                made_it = fs.commit_files(buf, mpath, prepare)
            else:
                made_it = fs.commit_files(buf, mpath, prepare, ready)
            if made_it:
                self._refuse_if_stray(seq_dir, st, history, mpath, made[0])
                self._count(CommitOutcome.COMMITTED, st)
                if batch:
                    self._unsynced_commits.append(seq_dir)
                    if len(self._unsynced_commits) >= folders.sync_batch:
                        self.sync()
                else:
                    self.retention.schedule(seq_dir)
                return CommitOutcome.COMMITTED
            existing = folders.read_manifest_if_any(mpath, None)
            if existing is None:  # pruned meanwhile: the history moved on past this number
                fs.remove(f"{seq_dir}/{made[0].data_file}")  # ours: it names our number
                newest = folders.vanished(seq_dir, history.commit) or history.commit
                raise moved_on(st.seq_id, history.commit, newest, mpath)
        manifest = made[0] if made else manifest_for(hashlib.sha256(buf).hexdigest())
        dpath = f"{seq_dir}/{manifest.data_file}"
        try:
            outcome = self._compare(st, manifest, existing, seq_dir, buf)
        finally:
            if existing.data_file != manifest.data_file:
                fs.remove(dpath)  # our data file lost the race (no-op if never written)
        self._count(outcome, st)
        return outcome

    def sync(self) -> None:
        """Make the folders of the commits made since the last sync durable (``sync_batch``),
        one fsync per folder and one of the root, in parallel; then prune them."""
        fs = self.folders.fs
        waiting, self.folders.unsynced = self.folders.unsynced, set()
        commits, self._unsynced_commits = self._unsynced_commits, []
        if waiting:
            assert isinstance(fs, LocalStorage)
            if fs.root not in waiting:
                waiting.add(fs.root)  # the folders' own names (another writer's too)
            self._sync_dirs(sorted(waiting))
        for seq_dir in dict.fromkeys(commits):
            self.retention.schedule(seq_dir)

    def sync_seq(self, seq_id: str) -> None:
        """Make the commits in the sequence's folder durable, whoever made them (before their
        outputs are published: a commit another job made may wait for its ``sync``)."""
        fs, seq_dir = self.folders.fs, self.folders.seq_dir(seq_id)
        if isinstance(fs, LocalStorage) and fs.is_dir(seq_dir):
            self._sync_dirs([seq_dir, fs.root])

    def _sync_dirs(self, folders: list[str]) -> None:
        fs = self.folders.fs
        assert isinstance(fs, LocalStorage)
        if len(folders) == 1:
            fs.sync_dir(folders[0])
            return
        for job in [in_thread(fs.sync_dir, f) for f in folders]:
            job.result()

    def _refuse_if_stray(
        self, seq_dir: str, st: SequenceState, history: History, mpath: str, ours: Manifest
    ) -> None:
        """A commit number can be free again after retention removed it; creating it then
        forks a history that has moved on.  Retention only removes commit n once commit
        n + keep exists, so a newer number in the folder right after the create tells."""
        names = self.folders.fs.list_dir(seq_dir)
        newest = max((n for n in map(parse_commit_name, names) if n is not None), default=0)
        if newest <= history.commit:
            return
        self.folders.fs.remove(mpath)
        self.folders.fs.remove(f"{seq_dir}/{ours.data_file}")
        msg = (
            f"sequence {st.seq_id!r}: this writer continued commit {history.commit - 1} "
            f"(position {history.parent_position}), but the history has moved on to commit "
            f"{newest}: another job advanced this sequence (one writer per sequence history)"
        )
        raise SupersededError(msg, path=mpath)

    def _auto_history(self, seq_dir: str, st: SequenceState) -> History:
        """The history of a commit made without one (see ``commit``)."""
        for path, n, pos in self.folders.commit_files(seq_dir):
            try:
                m = self.folders.parse_commit(path, n, pos)
            except (CheckpointError, FileNotFoundError):
                continue
            if m.position == st.position and n is not None:
                return replace(m.history or NO_HISTORY, outputs=None)  # a retry of this commit
            if m.position < st.position:
                number = 1 if n is None else n + 1
                return History(number, m.position, -1, b"")
        return History(1, 0, -1, b"")

    def _compare(
        self, st: SequenceState, ours: Manifest, existing: Manifest, seq_dir: str, buf: Any
    ) -> CommitOutcome:
        mine, theirs = ours.history or NO_HISTORY, existing.history or NO_HISTORY
        if (existing.position, existing.next_chunk, theirs.parent_position, theirs.final_chunk) != (
            st.position,
            st.next_chunk,
            mine.parent_position,
            mine.final_chunk,
        ) or theirs.digests != mine.digests:
            msg = (
                f"sequence {st.seq_id!r}: commit {mine.commit} already exists and continues "
                f"from position {theirs.parent_position} to position {existing.position} "
                f"(next chunk {existing.next_chunk}); this writer's commit from position "
                f"{mine.parent_position} to {st.position} (next chunk {st.next_chunk}) is "
                "refused: another job advanced this sequence (one writer per sequence history)"
            )
            raise SupersededError(msg, path=self.folders.commit_path(seq_dir, mine.commit))
        if existing.sha256 == ours.sha256:
            # A retried commit: make sure the data file is intact (repairs a lost or damaged one).
            dpath = f"{seq_dir}/{existing.data_file}"
            try:
                intact = (
                    hashlib.sha256(self.folders.fs.read(dpath, ours.size)).hexdigest()
                    == ours.sha256
                )
            except FileNotFoundError:
                intact = False
            if not intact:
                log.warning("%s: rewriting the missing or damaged data file of a commit", dpath)
                self.folders.fs.write_immutable(dpath, buf)
                # Retention removes a commit file first, then its data file: if the commit
                # is gone now, its data file was missing because it was removed with it, and
                # the file just written back would be an orphan.
                newest = self.folders.vanished(seq_dir, mine.commit)
                if newest is not None:
                    self.folders.fs.remove(dpath)
                    path = self.folders.commit_path(seq_dir, mine.commit)
                    raise moved_on(st.seq_id, mine.commit, newest, path)
            return CommitOutcome.DUPLICATE
        where = f"sequence {st.seq_id!r} position {st.position}"
        first = self.restorer.read_chain(
            st.seq_id, mine.commit
        ).state  # moved_on if pruned meanwhile
        if first.fingerprint != st.fingerprint:
            msg = (
                f"{where}: already committed by another model (fingerprint "
                f"{first.fingerprint[:16]}…, this state {st.fingerprint[:16]}…)"
            )
            raise DivergentStateError(msg, path=self.folders.commit_path(seq_dir, mine.commit))
        if (first.next_chunk, first.dtype, first.layout) != (st.next_chunk, st.dtype, st.layout):
            msg = (
                f"{where}: committed state has next_chunk {first.next_chunk}, dtype "
                f"{first.dtype}, shape {_shape(first)}; this state has {st.next_chunk}, "
                f"{st.dtype}, {_shape(st)}"
            )
            raise DivergentStateError(msg, path=self.folders.commit_path(seq_dir, mine.commit))
        rtol = self.rtol if self.rtol is not None else DEFAULT_RTOL[str(st.dtype)]
        committed = first.tensors
        diff = max(_max_rel_diff(a, committed[n]) for n, a in st.tensors.items())
        if diff <= rtol:
            log.info(
                "%s: already committed with a state equal within tolerance (max relative "
                "difference %.3g <= %.3g); keeping the first commit",
                where,
                diff,
                rtol,
            )
            return CommitOutcome.EQUAL_WITHIN_TOLERANCE
        msg = (
            f"{where}: a different state is already committed (max relative difference "
            f"{diff:.3g} > tolerance {rtol:.3g})"
        )
        raise DivergentStateError(msg, path=self.folders.commit_path(seq_dir, mine.commit))

    def _count(self, outcome: CommitOutcome, st: SequenceState) -> None:
        self.counters[outcome.value] += 1
        log.debug("commit %r position %d: %s", st.seq_id, st.position, outcome.value)
