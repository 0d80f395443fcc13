"""linstream.state: the per-sequence state value, its Arrow codec and the checkpoint store.

No Beam here: the pipeline keeps ``encode_state`` bytes in Beam state and commits to a
``CheckpointStore``.
"""

from .codec import FORMAT_VERSION, READER_VERSION, decode_state, encode_state
from .compact import pack_state, unpack_state
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    DivergentStateError,
    ModelMismatchError,
    NonFiniteStateError,
    SupersededError,
    UnsupportedFormatVersionError,
)
from .manifest import DIGEST_BYTES, MAX_DIGESTS, History, OutputSpan
from .sequence_state import SequenceState
from .store import CheckpointProblem, CheckpointStore, CommitInfo, CommitOutcome, Head

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
    "pack_state",
    "unpack_state",
]
