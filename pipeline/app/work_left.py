"""What a job has left to do, for its progress line: the input's tokens less those that the
checkpoint store already holds for the input's sequences (a resumed job skips them).

Counted before the run, cheaply or not at all: the input's total comes from Parquet footers or
file sizes (`InputPlan.token_total`), its sequence ids from file names or the `seq_id` column
(`InputPlan.sequence_ids`), and each sequence's committed position from its newest commit's
manifest.  When any of these cannot be had cheaply, there is no total (the progress line then
shows tokens and tokens/s without a percentage or an ETA) rather than a wrong one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from linstream.pipeline.io.input_plan import InputPlan
    from linstream.state import CheckpointStore

__all__ = ["committed_tokens", "tokens_to_do"]

#: Beyond this many sequences, reading each one's newest manifest costs more than the line is
#: worth (one listing and one read per sequence; on an object store, a request each).
MAX_SEQUENCES = 1000


def committed_tokens(store: CheckpointStore, seq_ids: set[str]) -> int | None:
    """Tokens of ``seq_ids`` that the store's newest readable commits hold (0 for a sequence it
    does not know), or None for more than `MAX_SEQUENCES` sequences."""
    if len(seq_ids) > MAX_SEQUENCES:
        return None
    if not store.exists():
        return 0
    done = 0
    for seq_id in seq_ids:
        readable = [c for c in store.commits(seq_id) if c.problem is None]
        done += readable[0].position if readable else 0
    return done


def tokens_to_do(inputs: InputPlan, resumed: CheckpointStore | None) -> int | None:
    """Tokens this job will apply (its progress line's 100%), or None when unknown;
    ``resumed``: the checkpoint store a `--resume` continues from (its sequences' committed
    tokens are not to do)."""
    total = inputs.token_total()
    if total is None or resumed is None:
        return total
    ids = inputs.sequence_ids()
    done = None if ids is None else committed_tokens(resumed, ids)
    return None if done is None else max(total - done, 0)
