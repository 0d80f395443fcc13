"""linstream.state: the per-sequence state value, its Arrow codec and the checkpoint store.

No Beam here: the pipeline keeps ``encode_state`` bytes in Beam state and commits to a
``CheckpointStore``.
"""

from .codec import FORMAT_VERSION, READER_VERSION, decode_state, encode_state
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    DivergentStateError,
    ModelMismatchError,
    NonFiniteStateError,
    UnsupportedFormatVersionError,
)
from .sequence_state import SequenceState
from .store import CheckpointProblem, CheckpointStore, CommitInfo, CommitOutcome

__all__ = [
    "FORMAT_VERSION",
    "READER_VERSION",
    "CheckpointError",
    "CheckpointProblem",
    "CheckpointStore",
    "CommitInfo",
    "CommitOutcome",
    "CorruptCheckpointError",
    "DivergentStateError",
    "ModelMismatchError",
    "NonFiniteStateError",
    "SequenceState",
    "UnsupportedFormatVersionError",
    "decode_state",
    "encode_state",
]
