"""Restoring a sequence from the checkpoint store and committing it there, with its outputs.

The stateful stage (sequence_stage.py) calls `Commits.restore` when a sequence is first seen
with resume on, or returns after an eviction, and `Commits.commit` every ``checkpoint_every``
chunks, at the final chunk and when the sequence goes idle.  A commit writes the held outputs as
the span it finalizes (spans.py) and creates the next commit of the sequence's chain;
docs/crash-recovery.md describes the protocol.

Publishing a committed span (its last step: the final name linked and made durable) runs in a
background thread, off the per-element path: the commit already names the span, and a restore
rolls it forward if a crash stopped the publish.  A sequence's publish is waited for before its
next commit (a restore rolls forward the newest commit only) and all of them at the end of
each bundle (`flush`), so a bundle that succeeds has published every span it committed.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future, ThreadPoolExecutor
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
)
from linstream.state.store.manifest import Manifest

from .cells import Cells
from .counters import Counters
from .records import DigestWindow, Meta
from .spans import SpanWriter
from .steps import ChunkStep

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
        self._publisher: ThreadPoolExecutor | None = None
        self._publishing: dict[str, Future[bool]] = {}
        if spans is not None:  # output folders this store's jobs marked are trusted too
            spans.store_location = store.location

    def _check(self, m: Manifest) -> None:
        """A manifest's output span names only files this job may touch (else it is refused
        like a corrupt commit: see spans.py)."""
        if self.spans is not None and m.history is not None and m.history.outputs is not None:
            self.spans.check(m.history.outputs, m.seq_id)

    def flush(self) -> None:
        """Wait for every background publish; raises the first one's error."""
        pending, self._publishing = self._publishing, {}
        for future in pending.values():
            future.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._publisher is not None:
                self._publisher.shutdown()
                self._publisher = None

    def _publish_later(self, seq_id: str, span: OutputSpan) -> None:
        assert self.spans is not None
        if self._publisher is None:
            self._publisher = ThreadPoolExecutor(1, thread_name_prefix="linstream-publish")
        self._publishing[seq_id] = self._publisher.submit(self.spans.publish, span, written=True)

    def _discard(self, span: OutputSpan | None, writing: Any) -> None:
        """A span whose commit did not happen (or was another writer's): its file goes."""
        _join_quietly(writing)
        if span is not None and self.spans is not None:
            self.spans.discard(span)

    def _keep_outputs(
        self, seq_id: str, kept: History, span: OutputSpan | None, writing: Any
    ) -> None:
        """Another commit of the same state stands: its outputs are published and this
        writer's copy of them goes; unless they are lost, when this writer's span (the same
        chunks, computed from the same state) is published in their place."""
        if self.finalize_outputs(kept):
            self._discard(span, writing)
            return
        lost = kept.outputs
        assert lost is not None
        what = (
            f"sequence {seq_id!r}: the outputs of chunks {lost.first_chunk}..{lost.end_chunk - 1}"
            f" (commit {kept.commit}, {lost.file}) are missing or damaged"
        )
        if not _same_chunks(span, lost):
            self._discard(span, writing)
            _log.warning("%s; this job did not compute the same chunks", what)
            return
        assert span is not None
        try:
            writing.result()
        except Exception:
            self._discard(span, None)
            raise
        _log.warning("%s; this job's own output of the same chunks is published instead", what)
        self._publish_later(seq_id, span)

    def _published(self, seq_id: str) -> None:
        """The sequence's previous span is published (raises its error)."""
        future = self._publishing.pop(seq_id, None)
        if future is not None:
            future.result()

    def restore(self, seq_id: str, data: object, meta: Meta, cells: Cells) -> SequenceState | None:
        """The sequence's newest committed state (None: never committed); fills ``meta`` and
        the cells' digests and output sum from its history.

        When the newest commit's outputs are gone (its published file deleted or damaged, its
        pending file damaged before it was published), the state before them is its parent
        commit's: the sequence continues from there, so that those chunks are computed and
        published again (the next commit is numbered above the newest, as after a fallback).
        """
        self.flush()  # a roll-forward below may publish a span a background publish holds
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
        start: Head | None = head
        if not self.finalize_outputs(head.history):
            start = self._before_lost_outputs(seq_id, head, shape)
        if self.spans is not None:
            # Pending files of commits the history holds (by number, never by age).
            self.spans.remove_orphans(seq_id, up_to_commit=meta.commit_no)
            for _path, skipped in head.skipped:  # rolled back: their chunks are applied again
                if skipped is not None and skipped.history and skipped.history.outputs:
                    self.spans.remove_published(skipped.history.outputs)
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
        """Where to continue when ``head``'s outputs are lost: its parent commit (None: the
        sequence's start), or ``head`` itself when the parent cannot give them back."""
        span = head.history.outputs
        assert span is not None and self.spans is not None
        what = (
            f"sequence {seq_id!r}: the outputs of chunks {span.first_chunk}.."
            f"{span.end_chunk - 1} (commit {head.history.commit}, {span.file}) are missing or "
            "damaged"
        )
        parent: Head | None = None
        why = ""
        if head.history.parent_position > 0:
            try:
                parent = self.store.read_position(
                    seq_id,
                    head.history.parent_position,
                    fingerprint=self.step.fingerprint,
                    expected_shape=shape,
                    check=self._check,
                )
            except CheckpointError as ex:
                why = f"the commit before them cannot be read ({ex})"
        at = 0 if parent is None else parent.state.next_chunk
        if not why and at != span.first_chunk:
            why = f"the commit before them ends at chunk {at}, not {span.first_chunk}"
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
        self.spans.discard(span)  # a damaged pending file must not be published later
        self.spans.remove_published(span)  # a damaged published one goes
        return parent

    def finalize_outputs(self, history: History) -> bool:
        """Roll a commit's output span forward (publish it if a crash stopped that); False when
        its outputs are lost (neither its file nor its pending copy holds them)."""
        if self.spans is None or history.outputs is None:
            return True
        if self.spans.publish(history.outputs):
            return True
        self.m.outputs_missing.inc()
        return False

    def commit(
        self, seq_id: str, st: SequenceState, meta: Meta, cells: Cells
    ) -> tuple[SequenceState, DivergentStateError | None]:
        """Commit ``st`` and the held outputs: the state to go on from, and the refusal when
        another job advanced the sequence (``meta.fenced`` is then set)."""
        if meta.committed_next == st.next_chunk:
            return st, None
        self._published(seq_id)
        span = writing = None
        if self.spans is not None:
            results = cells.held_outputs()
            if results:  # written while the commit's own files are (the commit waits for it)
                span, writing = self.spans.write_pending_async(
                    seq_id, results, commit=meta.commit_no + 1
                )
        history = History(
            meta.commit_no + 1,
            meta.committed_position,
            meta.final_index if 0 <= meta.final_index < st.next_chunk else -1,
            cells.window.data,
            span,
            (cells.outsum or b"") if self.emit == "sequence" else b"",
        )
        try:
            outcome = self.store.commit(
                st, history, ready=None if writing is None else writing.result
            )
        except DivergentStateError as ex:  # another job advanced it, or another model's state
            self._discard(span, writing)
            meta.fenced = True
            return st, ex
        except BaseException:
            _join_quietly(writing)  # the pending file stays an orphan, as after a crash
            raise
        self.m.commits.inc()
        if outcome == CommitOutcome.COMMITTED:
            if span is not None:  # its write is durable: the commit waited for it
                self._publish_later(seq_id, span)
        else:
            # A retried bundle (or a twin job): the commit that is there stands, with its outputs.
            try:
                kept = self.store.read_chain(
                    seq_id, history.commit, fingerprint=self.step.fingerprint, check=self._check
                )
            except DivergentStateError as ex:  # gone: the other job moved on past it
                self._discard(span, writing)
                meta.fenced = True
                return st, ex
            self._keep_outputs(seq_id, kept.history, span, writing)
            if outcome == CommitOutcome.DUPLICATE:
                self.m.commit_duplicates.inc()
            else:
                self.m.commit_equal_within_tolerance.inc()
                st = kept.state
        meta.commit_no, meta.committed_next = history.commit, st.next_chunk
        meta.committed_position = st.position
        cells.clear_outputs()
        return st, None


def _same_chunks(a: OutputSpan | None, b: OutputSpan | None) -> bool:
    if a is None or b is None:
        return False
    return (a.first_chunk, a.end_chunk) == (b.first_chunk, b.end_chunk)


def _join_quietly(writing: Any) -> None:
    """Wait for a span's write, whose file is not used (its error does not matter)."""
    if writing is not None:
        with contextlib.suppress(Exception):
            writing.result()
