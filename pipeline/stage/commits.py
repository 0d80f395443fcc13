"""Restoring a sequence from the checkpoint store and committing it there, with its outputs.

The stateful stage (sequence_stage.py) calls `Commits.restore` when a sequence is first seen
with resume on, or returns after an eviction, and `Commits.commit` every ``checkpoint_every``
chunks, at the final chunk and when the sequence goes idle.  A commit writes the held outputs
to a pending file of the open output group (spans.py) and creates the next commit of the
sequence's chain, whose manifest names the sequence's span in the group;
docs/crash-recovery.md describes the protocol.

Publishing (the group's committed rows as one file) happens when the group closes: at the end
of each bundle (`flush`), so a bundle that succeeds has published every span it committed, or
once the group holds `spans.GROUP_BYTES`.  A restore rolls the sequence's newest span forward
whoever wrote it, so a crash between a commit and its publish loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from linstream.state import (
    CheckpointError,
    CheckpointStore,
    CommitOutcome,
    DivergentStateError,
    Head,
    History,
    OutputSpan,
    SequenceState,
    SupersededError,
)
from linstream.state.store import Manifest

from .cells import Cells
from .counters import Counters
from .records import DigestWindow, Meta
from .spans import SpanWriter, Staged
from .steps import ChunkStep
from .stop_publish import gated, register

__all__ = ["Commits"]

_log = logging.getLogger(__name__)


class Commits:
    """A stage's checkpoint store and output spans (either may be absent)."""

    def __init__(
        self,
        store: CheckpointStore,
        spans: SpanWriter | None,
        step: ChunkStep,
        counters: Counters,
        *,
        emit: str,
        restore_fallback: bool,
    ) -> None:
        self.store, self.spans, self.step, self.m = store, spans, step, counters
        self.emit, self.restore_fallback = emit, restore_fallback
        if spans is not None:  # output folders this store's jobs marked are trusted too
            spans.store_location = store.location
            # Rows are published only once the commits naming them are durable.
            spans.durable, spans.durable_seq = store.sync, store.sync_seq
        register(self)  # a stop publishes what this stage's commits cover (stop_publish.py)

    def _check(self, m: Manifest) -> None:
        """A manifest's output span names only files this job may touch (else it is refused
        like a corrupt commit: see spans.py)."""
        if self.spans is not None and m.history is not None and m.history.outputs is not None:
            self.spans.check(m.history.outputs, m.seq_id)

    @gated
    def start_bundle(self) -> None:
        if self.spans is not None:
            self.spans.reset()  # a group left by a failed bundle is rolled forward by others

    @gated
    def flush(self) -> None:
        """Make the commits made since the last flush durable (their folders' fsyncs, batched:
        ``CheckpointStore.sync``), then publish the open output group (every span they
        committed)."""
        self.store.sync()
        if self.spans is not None:
            self.spans.flush()

    def close(self) -> None:
        self.flush()

    def _discard(self, staged: Staged | None) -> None:
        """A span whose commit did not happen (or was another writer's): its file goes."""
        if staged is not None and self.spans is not None:
            _join_quietly(staged.writing)
            self.spans.discard(staged)

    def _keep_outputs(self, seq_id: str, kept: History, staged: Staged | None) -> None:
        """Another commit of the same state stands: its outputs are published and this
        writer's copy of them goes; unless they are lost, when this writer's span (the same
        chunks, computed from the same state) is published in their place."""
        spans = self.spans
        if spans is None:
            return
        if self.finalize_outputs(seq_id, kept):
            self._discard(staged)
            spans.continued_elsewhere(seq_id)
            return
        lost = kept.outputs
        assert lost is not None
        what = (
            f"sequence {seq_id!r}: the outputs of chunks {lost.first_chunk}..{lost.end_chunk - 1}"
            f" (commit {kept.commit}, {lost.file}) are missing or damaged"
        )
        if staged is None or not _same_chunks(staged.span, lost):
            self._discard(staged)
            spans.continued_elsewhere(seq_id)
            _log.warning("%s; this job did not compute the same chunks", what)
            return
        try:
            if staged.writing is not None:
                staged.writing.result()
        except Exception:
            self._discard(staged)
            raise
        _log.warning("%s; this job's own output of the same chunks is published instead", what)
        spans.discard_lost(lost, seq_id, kept.commit)  # what is left of them goes
        spans.committed(staged)

    @gated
    def restore(self, seq_id: str, data: object, meta: Meta, cells: Cells) -> SequenceState | None:
        """The sequence's newest committed state (None: never committed); fills ``meta`` and
        the cells' digests and output sum from its history.

        When the newest commit's outputs are gone (its published file deleted or damaged, its
        pending file damaged before it was published), the state before them is its parent
        commit's: the sequence continues from there, so that those chunks are computed and
        published again (the next commit is numbered above the newest, as after a fallback).
        """
        shape = self.step.state_shape(data)
        head = self.store.head(
            seq_id,
            fingerprint=self.step.fingerprint,
            fallback=self.restore_fallback,
            expected_shape=shape,
            check=self._check,
        )
        if head is not None and meta.evicted and head.newest_commit != meta.commit_no:
            msg = (
                f"sequence {seq_id!r} was evicted after its commit {meta.commit_no}, but the "
                f"newest commit in {self.store.root!r} is {head.history.commit}: another job "
                "advanced it (one writer per sequence history)"
            )
            raise CheckpointError(msg)
        if _no_running_sum(head, self.emit):  # made with another emit than "sequence"
            msg = (
                f"sequence {seq_id!r}: its checkpoint in {self.store.root!r} was made with "
                "another emit than 'sequence' (it carries no running sum), so the mean over "
                "all its tokens cannot be formed; continue it with the emit it was made with, "
                "or start it again in an empty checkpoint folder"
            )
            raise CheckpointError(msg)
        if head is None:
            if meta.evicted:
                msg = (
                    f"sequence {seq_id!r} was evicted to the checkpoint store "
                    f"{self.store.root!r}, but no checkpoint of it could be restored"
                )
                raise CheckpointError(msg)
            return None
        # After a fallback the next commit goes above the unreadable ones (newest_commit).
        meta.commit_no = max(head.history.commit, head.newest_commit)
        if self.spans is not None:
            self.spans.forget(seq_id)  # its rows in the open group are the newest commit's
        start: Head | None = head
        if not self.finalize_outputs(seq_id, head.history):
            start = self._before_lost_outputs(seq_id, head, shape)
        if self.spans is not None:
            # Pending files of commits the history holds (by number, never by age).
            self.spans.remove_orphans(seq_id, up_to_commit=meta.commit_no)
            again = 0 if start is None else start.state.next_chunk
            for _path, skipped in head.skipped:  # rolled back: their chunks are applied again
                if skipped is not None and skipped.history and skipped.history.outputs:
                    self.spans.remove_published(skipped.history.outputs, seq_id, again)
        self.m.restores.inc()
        if start is None:  # from the first chunk again
            meta.committed_next, meta.committed_position, meta.final_index = 0, 0, -1
            cells.window, cells.outsum = DigestWindow(None), None
            return None
        st = start.state
        meta.committed_next = st.next_chunk
        meta.committed_position = st.position
        meta.final_index = start.history.final_chunk
        cells.window = DigestWindow(start.history.digests)
        cells.outsum = start.history.output_sum or None
        return st

    def _before_lost_outputs(
        self, seq_id: str, head: Head, shape: tuple[int, ...] | None
    ) -> Head | None:
        """Where to continue when ``head``'s outputs are lost: the commit its span starts from
        (None: the sequence's start), or ``head`` itself when the store cannot give it."""
        span = head.history.outputs
        assert span is not None and self.spans is not None
        what = (
            f"sequence {seq_id!r}: the outputs of chunks {span.first_chunk}.."
            f"{span.end_chunk - 1} (commit {head.history.commit}, {span.file}) are missing or "
            "damaged"
        )
        at = span.first_chunk
        start: Head | None = None
        why = ""
        if at > 0:
            try:
                start = self._commit_ending_at(seq_id, head, at, shape)
            except CheckpointError as ex:
                why = f"the commit before them cannot be read ({ex})"
            if not why and start is None:
                why = f"the store keeps no commit that ends at chunk {at}"
        if why:
            _log.warning(
                "%s and cannot be computed again from this store: %s. To get them back, run "
                "the sequence's input again from its first chunk with a new --checkpoint-dir "
                "and --output, and take those chunks from its results",
                what,
                why,
            )
            return head
        _log.warning(
            "%s; continuing the sequence from chunk %d to compute and publish them again",
            what,
            at,
        )
        self.spans.discard_lost(span, seq_id, head.history.commit)
        return start

    def _commit_ending_at(
        self, seq_id: str, head: Head, at: int, shape: tuple[int, ...] | None
    ) -> Head | None:
        """The sequence's commit whose state ends at chunk ``at`` (the parent first; None when
        the store keeps none)."""
        positions = [head.history.parent_position] if head.history.parent_position > 0 else []
        for info in self.store.commits(seq_id):
            if info.next_chunk == at and info.position not in positions:
                positions.append(info.position)
        for position in positions:
            found = self.store.read_position(
                seq_id,
                position,
                fingerprint=self.step.fingerprint,
                expected_shape=shape,
                check=self._check,
            )
            if found.state.next_chunk == at:
                return found
        return None

    def finalize_outputs(self, seq_id: str, history: History) -> bool:
        """Roll a commit's output span forward (publish it if a crash stopped that); False when
        its outputs are lost (neither its published files nor its pending ones hold them)."""
        if self.spans is None or history.outputs is None:
            return True
        if self.spans.publish(history.outputs, seq_id, history.commit):
            return True
        self.m.outputs_missing.inc()
        return False

    @gated
    def commit(
        self, seq_id: str, st: SequenceState, meta: Meta, cells: Cells
    ) -> tuple[SequenceState, DivergentStateError | None]:
        """Commit ``st`` and the held outputs: the state to go on from, and the refusal when
        another job advanced the sequence (``meta.fenced`` is then set)."""
        if meta.committed_next == st.next_chunk:
            return st, None
        staged = None
        if self.spans is not None:  # written while the commit's own files are (it waits)
            staged = self.spans.stage(
                seq_id,
                cells.held_outputs(),
                commit=meta.commit_no + 1,
                since=max(meta.committed_next, 0),
                end=st.next_chunk,
            )
        history = History(
            meta.commit_no + 1,
            meta.committed_position,
            meta.final_index if 0 <= meta.final_index < st.next_chunk else -1,
            cells.window.data,
            None if staged is None else staged.span,
            (cells.outsum or b"") if self.emit == "sequence" else b"",
        )
        writing = None if staged is None else staged.writing
        try:
            outcome = self.store.commit(
                st, history, ready=None if writing is None else writing.result
            )
        except DivergentStateError as ex:  # another job advanced it, or another model's state
            self._discard(staged)
            meta.fenced = True
            return st, ex
        except BaseException:
            _join_quietly(writing)  # the pending file stays an orphan, as after a crash
            raise
        self.m.commits.inc()
        if outcome == CommitOutcome.COMMITTED:
            if staged is not None and self.spans is not None:  # durable: the commit waited
                self.spans.committed(staged)
        else:
            # A retried bundle (or a twin job): the commit that is there stands, with its outputs.
            try:
                kept = self.store.read_chain(
                    seq_id, history.commit, fingerprint=self.step.fingerprint, check=self._check
                )
            except DivergentStateError as ex:  # gone: the other job moved on past it
                self._discard(staged)
                meta.fenced = True
                return st, ex
            except CheckpointError as ex:  # gone or changed before it was read back
                self._discard(staged)
                meta.fenced = True
                return st, _taken(seq_id, history.commit, ex)
            self._keep_outputs(seq_id, kept.history, staged)
            if outcome == CommitOutcome.DUPLICATE:
                self.m.commit_duplicates.inc()
            else:
                self.m.commit_equal_within_tolerance.inc()
                st = kept.state
        meta.commit_no, meta.committed_next = history.commit, st.next_chunk
        meta.committed_position = st.position
        cells.clear_outputs()
        return st, None


def _no_running_sum(head: Head | None, emit: str) -> bool:
    """Whether ``head`` cannot be continued with emit="sequence": it holds tokens, but not the
    running sum of their outputs (it was made with another emit)."""
    if head is None or emit != "sequence":
        return False
    return head.state.position > 0 and not head.history.output_sum


def _taken(seq_id: str, commit: int, why: CheckpointError) -> SupersededError:
    """The refusal of a writer whose commit found another writer's equal commit there, which
    could not be read back (its writer's retention removed it, having moved on): the sequence
    is the other writer's."""
    msg = (
        f"sequence {seq_id!r}: commit {commit} is another writer's and could not be read back "
        f"({why}): another job advanced this sequence (one writer per sequence history)"
    )
    return SupersededError(msg)


def _same_chunks(a: OutputSpan | None, b: OutputSpan | None) -> bool:
    if a is None or b is None:
        return False
    return (a.first_chunk, a.end_chunk) == (b.first_chunk, b.end_chunk)


def _join_quietly(writing: Any) -> None:
    """Wait for a span's write, whose file is not used (its error does not matter)."""
    if writing is not None:
        with contextlib.suppress(Exception):
            writing.result()
