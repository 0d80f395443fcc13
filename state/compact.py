"""The working copy of a state in Beam state: a compact binary form, cheap to write per chunk.

Checkpoints use the Arrow codec (``codec.py``): self-describing, versioned and digested, because
they outlive the job and are untrusted when read back.  Beam state lives only inside the running
job (the runner keeps it, a retried bundle sees the same bytes), and it is rewritten after every
chunk, so it uses this fixed little-endian layout instead: a header (magic, dtype code, shape,
position, next chunk, sequence id and fingerprint lengths) followed by the two strings and the
tensor bytes of S and z.  A state of other named tensors (``SequenceState.extra``, no z) uses a
second header (magic ``LSW2``) followed by the strings, the layout's JSON (``layout.py``) and the
tensors in layout order.  Decoding checks every length against the buffer and views the tensors
without copying.  No pickle.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import CorruptCheckpointError
from .layout import layout_from_json, layout_to_json
from .sequence_state import SequenceState, zero_copy_of_immutable_buffers

__all__ = ["pack_layers", "pack_state", "unpack_state"]

_MAGIC = b"LSW1"
# magic, dtype code, L, H, F, d_v, position, next_chunk, len(seq_id), len(fingerprint)
_HEAD = struct.Struct("<4sBIIIIqqII")
_DTYPES: dict[int, np.dtype] = {0: np.dtype("<f8"), 1: np.dtype("<f4")}
_CODES: dict[np.dtype, int] = {np.dtype("<f8"): 0, np.dtype("<f4"): 1}
_MAGIC_NAMED = b"LSW2"
# magic, dtype code, position, next_chunk, len(seq_id), len(fingerprint), len(layout JSON)
_HEAD_NAMED = struct.Struct("<4sBqqIII")


def pack_state(st: SequenceState) -> bytes:
    """The working-copy bytes of ``st``."""
    if not st.classic:
        return _pack_named(st)
    assert st.z is not None
    dtype = st.S.dtype.newbyteorder("<")
    L, H, F, dv = st.S.shape
    sid, fp = st.seq_id.encode("utf-8"), st.fingerprint.encode("utf-8")
    head = _HEAD.pack(
        _MAGIC, _CODES[dtype], L, H, F, dv, st.position, st.next_chunk, len(sid), len(fp)
    )
    S = np.ascontiguousarray(st.S, dtype=dtype)
    z = np.ascontiguousarray(st.z, dtype=dtype)
    return b"".join((head, sid, fp, S.data, z.data))


def pack_layers(
    seq_id: str, position: int, next_chunk: int, layers: Sequence[Any], fingerprint: str
) -> bytes | None:
    """``pack_state(SequenceState.from_layers(seq_id, position, next_chunk, layers,
    fingerprint))`` without stacking the layers first (one copy instead of two, and none of the
    checks a state makes on its arrays); None when the layers are not per-layer S and z of one
    shape and a state dtype (the caller then builds the state)."""
    first = layers[0] if layers else None
    S0, z0 = getattr(first, "S", None), getattr(first, "z", None)
    if not isinstance(S0, np.ndarray) or not isinstance(z0, np.ndarray) or S0.ndim != 3:
        return None
    code = _CODES.get(S0.dtype.newbyteorder("<"))
    if code is None or S0.dtype.byteorder == ">":
        return None
    dtype, (H, F, dv) = S0.dtype, S0.shape
    for layer in layers:
        S, z = getattr(layer, "S", None), getattr(layer, "z", None)
        if not isinstance(S, np.ndarray) or not isinstance(z, np.ndarray):
            return None
        if S.shape != S0.shape or z.shape != (H, F) or S.dtype != dtype or z.dtype != dtype:
            return None
    try:
        sid, fp = seq_id.encode("utf-8"), fingerprint.encode("utf-8")
        head = _HEAD.pack(
            _MAGIC, code, len(layers), H, F, dv, position, next_chunk, len(sid), len(fp)
        )
    except (UnicodeEncodeError, struct.error):  # out of range: the state's checks say so
        return None
    S_parts = [np.ascontiguousarray(layer.S).data for layer in layers]
    z_parts = [np.ascontiguousarray(layer.z).data for layer in layers]
    return b"".join((head, sid, fp, *S_parts, *z_parts))


def _pack_named(st: SequenceState) -> bytes:
    dtype = st.dtype.newbyteorder("<")
    sid, fp = st.seq_id.encode("utf-8"), st.fingerprint.encode("utf-8")
    layout = layout_to_json(st.layout)
    head = _HEAD_NAMED.pack(
        _MAGIC_NAMED, _CODES[dtype], st.position, st.next_chunk, len(sid), len(fp), len(layout)
    )
    arrays = [np.ascontiguousarray(a, dtype=dtype).data for a in st.tensors.values()]
    return b"".join((head, sid, fp, layout, *arrays))


def _unpack_named(raw: bytes, expected_fingerprint: str | None) -> SequenceState:
    if len(raw) < _HEAD_NAMED.size:
        msg = f"working copy of {len(raw)} bytes is shorter than its header"
        raise CorruptCheckpointError(msg)
    _magic, code, position, next_chunk, n_sid, n_fp, n_layout = _HEAD_NAMED.unpack_from(raw)
    dtype = _DTYPES.get(code)
    off = _HEAD_NAMED.size
    if dtype is None or off + n_sid + n_fp + n_layout > len(raw):
        msg = "not a linstream working copy (dtype code or lengths)"
        raise CorruptCheckpointError(msg)
    seq_id = raw[off : off + n_sid].decode("utf-8")
    fingerprint = raw[off + n_sid : off + n_sid + n_fp].decode("utf-8")
    if expected_fingerprint is not None and fingerprint != expected_fingerprint:
        msg = "working copy belongs to another model"
        raise CorruptCheckpointError(msg)
    off += n_sid + n_fp
    try:
        layout = layout_from_json(raw[off : off + n_layout])
    except ValueError as ex:
        raise CorruptCheckpointError(str(ex)) from ex
    off += n_layout
    end = off + sum(math.prod(s) for _, s in layout) * dtype.itemsize
    if end != len(raw):
        msg = f"working copy has {len(raw)} bytes, its header describes {end}"
        raise CorruptCheckpointError(msg)
    tensors = {}
    for name, shape in layout:
        n = math.prod(shape)
        tensors[name] = np.frombuffer(raw, dtype, n, off).reshape(shape)
        off += n * dtype.itemsize
    S, z = tensors.pop("S"), tensors.pop("z", None)
    with zero_copy_of_immutable_buffers():
        return SequenceState(seq_id, position, next_chunk, S, z, fingerprint, tensors)


def unpack_state(raw: bytes, *, expected_fingerprint: str | None = None) -> SequenceState:
    """The state packed in ``raw``; raises ``CorruptCheckpointError`` on a malformed buffer."""
    if raw[:4] == _MAGIC_NAMED:
        return _unpack_named(raw, expected_fingerprint)
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
