"""Forking and rewinding a sequence in a checkpoint store: a new commit equal to a retained one.

`select_commit` reads a sequence's newest commit, or its retained commit at a position, through
the store's own restore path (every check); a position that is not retained is refused with the
positions that are.  `fork` commits that state as the next commit of another sequence's chain
(or of the same one: a rewind), through the store's own commit path (atomic, verified like any
commit), with the chunk bookkeeping of the commit it copies (next chunk, final chunk, the digests
of the last chunks, the running sum of ``emit="sequence"``) and no output span: a later job over
the new sequence's input resumes it exactly as a resumed job resumes the original, and its
outputs are those of the chunks it applies.  Nothing is removed: commits above a rewind's
position stay in the store until retention drops them.
"""

from __future__ import annotations

import dataclasses

from .store import CheckpointStore, Head, History

__all__ = ["ForkError", "fork", "retained_positions", "select_commit"]


class ForkError(ValueError):
    """A fork, rewind or export refused: one line saying what was expected."""


def retained_positions(store: CheckpointStore, seq_id: str) -> list[int]:
    """The positions of ``seq_id``'s commits whose manifests can be read, ascending."""
    return sorted({c.position for c in store.commits(seq_id) if c.problem is None})


def _positions_text(positions: list[int]) -> str:
    if len(positions) > 32:
        shown = (
            ", ".join(map(str, positions[:16])) + ", ..., " + ", ".join(map(str, positions[-8:]))
        )
    else:
        shown = ", ".join(map(str, positions))
    return shown or "none"


def select_commit(store: CheckpointStore, seq_id: str, position: int | None = None) -> Head:
    """``seq_id``'s newest commit (``position`` None) or its newest commit at ``position``,
    read with every restore check (CheckpointError naming the file when one fails)."""
    positions = retained_positions(store, seq_id)
    if not positions:
        known = store.sequences()
        some = ", ".join(repr(s) for s in known[:8]) + (", ..." if len(known) > 8 else "")
        msg = (
            f"sequence {seq_id!r}: expected a sequence with a commit in {store.root}, found "
            f"none (sequences there: {some or 'none'})"
        )
        raise ForkError(msg)
    if position is None:
        head = store.head(seq_id, fingerprint=None)
        if head is None:  # removed meanwhile
            msg = f"sequence {seq_id!r}: no commit in {store.root}"
            raise ForkError(msg)
        return head
    if position not in positions:
        msg = (
            f"sequence {seq_id!r}: expected a retained position, received {position}; the "
            f"store keeps positions {_positions_text(positions)} (keep more with "
            "--keep-every-tokens)"
        )
        raise ForkError(msg)
    return store.read_position(seq_id, position)


def fork(
    store: CheckpointStore,
    seq_id: str,
    new_id: str,
    position: int | None = None,
    *,
    force: bool = False,
) -> Head:
    """Commit ``seq_id``'s state at ``position`` (its newest when None) as the newest commit of
    ``new_id``; ``new_id == seq_id`` rewinds it.  A ``new_id`` that has commits already is
    refused unless ``force`` (then its history continues from the copied state).  Returns
    the commit copied."""
    head = select_commit(store, seq_id, position)
    if new_id == seq_id and position is None:
        msg = f"sequence {seq_id!r}: a rewind needs a position (one of its retained commits)"
        raise ForkError(msg)
    existing = store.commits(new_id)
    if existing and new_id != seq_id and not force:
        newest = retained_positions(store, new_id)
        msg = (
            f"sequence {new_id!r}: expected a new sequence id, but it has {len(existing)} "
            f"commit(s) (newest at position {newest[-1] if newest else '?'}); --force makes it "
            f"continue from the state of sequence {seq_id!r} instead"
        )
        raise ForkError(msg)
    numbers = [c.commit for c in existing if c.commit is not None]
    kept = head.history  # its parent position too: a commit's parent lies below its position
    history = History(
        max(numbers, default=0) + 1,
        kept.parent_position,
        kept.final_chunk,
        kept.digests,
        None,
        output_sum=kept.output_sum,
    )
    store.commit(dataclasses.replace(head.state, seq_id=new_id), history)
    store.flush()
    return head
