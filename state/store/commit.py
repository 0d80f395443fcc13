"""The commit side of a checkpoint store: the history of a commit made without one, and what a
commit that finds its number taken concludes (a duplicate, a state equal within tolerance, or
another history: ``SupersededError`` / ``DivergentStateError``)."""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np
from linstream.state.errors import CheckpointError, DivergentStateError, SupersededError
from linstream.state.sequence_state import SequenceState

from .manifest import History, Manifest
from .paths import parse_commit_name
from .restore import StoreRestore
from .retention import StoreRetention
from .types import NO_HISTORY, CommitOutcome

__all__ = ["DEFAULT_RTOL", "StoreCommitChecks"]

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


class StoreCommitChecks(StoreRestore, StoreRetention):
    """The checks around ``CheckpointStore.commit``."""

    rtol: float | None

    def _refuse_if_stray(
        self, seq_dir: str, st: SequenceState, history: History, mpath: str, ours: Manifest
    ) -> None:
        """A commit number can be free again after retention removed it; creating it then
        forks a history that has moved on.  Retention only removes commit n once commit
        n + keep exists, so a newer number in the folder right after the create tells."""
        names = self._fs.list_dir(seq_dir)
        newest = max((n for n in map(parse_commit_name, names) if n is not None), default=0)
        if newest <= history.commit:
            return
        self._fs.remove(mpath)
        self._fs.remove(f"{seq_dir}/{ours.data_file}")
        msg = (
            f"sequence {st.seq_id!r}: this writer continued commit {history.commit - 1} "
            f"(position {history.parent_position}), but the history has moved on to commit "
            f"{newest}: another job advanced this sequence (one writer per sequence history)"
        )
        raise SupersededError(msg, path=mpath)

    def _auto_history(self, seq_dir: str, st: SequenceState) -> History:
        """The history of a commit made without one (see ``commit``)."""
        for path, n, pos in self._commit_files(seq_dir):
            try:
                m = self._parse_commit(path, n, pos)
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
            raise SupersededError(msg, path=self._cpath(seq_dir, mine.commit))
        if existing.sha256 == ours.sha256:
            # A retried commit: make sure the data file is intact (repairs a lost or damaged one).
            dpath = f"{seq_dir}/{existing.data_file}"
            try:
                intact = hashlib.sha256(self._fs.read(dpath, ours.size)).hexdigest() == ours.sha256
            except FileNotFoundError:
                intact = False
            if not intact:
                log.warning("%s: rewriting the missing or damaged data file of a commit", dpath)
                self._fs.write_immutable(dpath, buf)
                # Retention removes a commit file first, then its data file: if the commit
                # is gone now, its data file was missing because it was removed with it, and
                # the file just written back would be an orphan.
                newest = self._vanished(seq_dir, mine.commit)
                if newest is not None:
                    self._fs.remove(dpath)
                    path = self._cpath(seq_dir, mine.commit)
                    raise self.moved_on(st.seq_id, mine.commit, newest, path)
            return CommitOutcome.DUPLICATE
        where = f"sequence {st.seq_id!r} position {st.position}"
        first = self.read_chain(st.seq_id, mine.commit).state  # moved_on if pruned meanwhile
        if first.fingerprint != st.fingerprint:
            msg = (
                f"{where}: already committed by another model (fingerprint "
                f"{first.fingerprint[:16]}…, this state {st.fingerprint[:16]}…)"
            )
            raise DivergentStateError(msg, path=self._cpath(seq_dir, mine.commit))
        if (first.next_chunk, first.dtype, first.layout) != (st.next_chunk, st.dtype, st.layout):
            msg = (
                f"{where}: committed state has next_chunk {first.next_chunk}, dtype "
                f"{first.dtype}, shape {_shape(first)}; this state has {st.next_chunk}, "
                f"{st.dtype}, {_shape(st)}"
            )
            raise DivergentStateError(msg, path=self._cpath(seq_dir, mine.commit))
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
        raise DivergentStateError(msg, path=self._cpath(seq_dir, mine.commit))

    def _count(self, outcome: CommitOutcome, st: SequenceState) -> None:
        self.counters[outcome.value] += 1
        log.debug("commit %r position %d: %s", st.seq_id, st.position, outcome.value)
