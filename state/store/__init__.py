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
from .filesystems import FsspecStorage, LocalStorage, in_thread, open_storage
from .manifest import DIGEST_BYTES, MAX_DIGESTS, History, Manifest, OutputSpan
from .paths import encode_seq_dir, is_seq_dir

# The store's public surface.  Beside the store and its values: what a caller that writes files
# a commit names (the output spans of linstream.pipeline.stage.spans) needs to write and find
# them as the store does: the storage primitives (`open_storage`, the two storages,
# `in_thread`), the manifest a caller's own check reads, and the sequence folders' names.
__all__ = [
    "DIGEST_BYTES",
    "MAX_DIGESTS",
    "CheckpointProblem",
    "CheckpointStore",
    "CommitInfo",
    "CommitOutcome",
    "FsspecStorage",
    "Head",
    "History",
    "LocalStorage",
    "Manifest",
    "OutputSpan",
    "encode_seq_dir",
    "in_thread",
    "is_seq_dir",
    "open_storage",
]
