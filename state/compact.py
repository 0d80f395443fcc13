"""The working copy of a state in Beam state: a compact binary form, cheap to write per chunk.

Checkpoints use the Arrow codec (``codec.py``): self-describing, versioned and digested, because
they outlive the job and are untrusted when read back.  Beam state lives only inside the running
job (the runner keeps it, a retried bundle sees the same bytes), and it is rewritten after every
chunk, so it uses this fixed little-endian layout instead: a header (magic, dtype code, shape,
position, next chunk, sequence id and fingerprint lengths) followed by the two strings and the
tensor bytes of S and z.  Decoding checks every length against the buffer and views the tensors
without copying.  No pickle.
"""

from __future__ import annotations

import struct

import numpy as np

from .errors import CorruptCheckpointError
from .sequence_state import SequenceState, zero_copy_of_immutable_buffers

__all__ = ["pack_state", "unpack_state"]

_MAGIC = b"LSW1"
# magic, dtype code, L, H, F, d_v, position, next_chunk, len(seq_id), len(fingerprint)
_HEAD = struct.Struct("<4sBIIIIqqII")
_DTYPES: dict[int, np.dtype] = {0: np.dtype("<f8"), 1: np.dtype("<f4")}
_CODES: dict[np.dtype, int] = {np.dtype("<f8"): 0, np.dtype("<f4"): 1}


def pack_state(st: SequenceState) -> bytes:
    """The working-copy bytes of ``st``."""
    dtype = st.S.dtype.newbyteorder("<")
    L, H, F, dv = st.S.shape
    sid, fp = st.seq_id.encode("utf-8"), st.fingerprint.encode("utf-8")
    head = _HEAD.pack(
        _MAGIC, _CODES[dtype], L, H, F, dv, st.position, st.next_chunk, len(sid), len(fp)
    )
    S = np.ascontiguousarray(st.S, dtype=dtype)
    z = np.ascontiguousarray(st.z, dtype=dtype)
    return b"".join((head, sid, fp, S.data, z.data))


def unpack_state(raw: bytes, *, expected_fingerprint: str | None = None) -> SequenceState:
    """The state packed in ``raw``; raises ``CorruptCheckpointError`` on a malformed buffer."""
    if len(raw) < _HEAD.size:
        msg = f"working copy of {len(raw)} bytes is shorter than its header"
        raise CorruptCheckpointError(msg)
    magic, code, L, H, F, dv, position, next_chunk, n_sid, n_fp = _HEAD.unpack_from(raw)
    dtype = _DTYPES.get(code)
    if magic != _MAGIC or dtype is None:
        msg = "not a linstream working copy (magic or dtype code)"
        raise CorruptCheckpointError(msg)
    s_count, z_count = L * H * F * dv, L * H * F
    off = _HEAD.size
    end = off + n_sid + n_fp + (s_count + z_count) * dtype.itemsize
    if end != len(raw):
        msg = f"working copy has {len(raw)} bytes, its header describes {end}"
        raise CorruptCheckpointError(msg)
    seq_id = raw[off : off + n_sid].decode("utf-8")
    fingerprint = raw[off + n_sid : off + n_sid + n_fp].decode("utf-8")
    if expected_fingerprint is not None and fingerprint != expected_fingerprint:
        msg = "working copy belongs to another model"
        raise CorruptCheckpointError(msg)
    off += n_sid + n_fp
    S = np.frombuffer(raw, dtype, s_count, off).reshape(L, H, F, dv)
    z = np.frombuffer(raw, dtype, z_count, off + s_count * dtype.itemsize).reshape(L, H, F)
    with zero_copy_of_immutable_buffers():
        return SequenceState(seq_id, position, next_chunk, S, z, fingerprint)
