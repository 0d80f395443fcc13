"""linstream.state: the per-sequence state value, its Arrow codec and the checkpoint store.

    sequence_state  SequenceState: every layer's carried state after a prefix (immutable)
    layout          the named tensors a state carries (S, z, others), their JSON form
    codec           its Arrow IPC form (checkpoints), with ipc_bounds (checks before reading);
                    codec_named the format of states of named tensors (format 3),
                    arrow_tensors its columns
    compact         its compact form (the working copy in Beam state)
    errors          the named errors of this package
    store/          the checkpoint store (commits, restores, retention, verify, gc)

No Beam here: the pipeline keeps ``encode_state`` bytes in Beam state and commits to a
``CheckpointStore``.
"""

from .codec import FORMAT_VERSION, READER_VERSION, decode_state, encode_state
from .compact import pack_layers, pack_state, unpack_state
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    DivergentStateError,
    ModelMismatchError,
    NonFiniteStateError,
    SupersededError,
    UnsupportedFormatVersionError,
)
from .sequence_state import SequenceState
from .store import (
    DIGEST_BYTES,
    MAX_DIGESTS,
    CheckpointProblem,
    CheckpointStore,
    CommitInfo,
    CommitOutcome,
    Head,
    History,
    OutputSpan,
)

__all__ = [
    "DIGEST_BYTES",
    "FORMAT_VERSION",
    "MAX_DIGESTS",
    "READER_VERSION",
    "CheckpointError",
    "CheckpointProblem",
    "CheckpointStore",
    "CommitInfo",
    "CommitOutcome",
    "CorruptCheckpointError",
    "DivergentStateError",
    "Head",
    "History",
    "ModelMismatchError",
    "NonFiniteStateError",
    "OutputSpan",
    "SequenceState",
    "SupersededError",
    "UnsupportedFormatVersionError",
    "decode_state",
    "encode_state",
    "pack_layers",
    "pack_state",
    "unpack_state",
]
