"""linstream.state.store: the checkpoint store, where each sequence's committed states live.

checkpoint_store   CheckpointStore: the store, an object made of the parts below handed to
                   each other (commit, head, verify, gc, ... delegate to them)
folders            StoreFolders: the storage, sequence folders, commit files and their manifests
restore            Restorer: the newest readable commit, with every check
commit             Committer: a commit and the checks around it, the batched folder syncs
retention          Retention: pruning commits beyond ``keep``
listing            Listing: the store's sequences and commits, verify, gc
paths, manifest    file names in a sequence's folder; the commit manifest (its history, the
                   output span it finalizes)
filesystems        the two storage primitives (immutable write, create-if-absent) on local
                   disk and fsspec
safe_json          bounded JSON parsing for untrusted manifests
types              the values the store hands out
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
