"""linstream.state.store: the checkpoint store, where each sequence's committed states live.

checkpoint_store   CheckpointStore: commit, restore (head), verify, gc
commit, restore    the checks around a commit and a restore
retention, listing pruning old commits; listing, verifying and tidying a whole store
layout, paths      where things are: sequence folders, data and commit file names
manifest           the commit manifest (its history, the output span it finalizes)
filesystems        the two storage primitives (immutable write, create-if-absent) on local
                   disk and fsspec
safe_json          bounded JSON parsing for untrusted manifests
"""

from .checkpoint_store import CheckpointProblem, CheckpointStore, CommitInfo, CommitOutcome, Head
from .manifest import DIGEST_BYTES, MAX_DIGESTS, History, OutputSpan

__all__ = [
    "DIGEST_BYTES",
    "MAX_DIGESTS",
    "CheckpointProblem",
    "CheckpointStore",
    "CommitInfo",
    "CommitOutcome",
    "Head",
    "History",
    "OutputSpan",
]
