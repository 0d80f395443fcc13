"""Arrow codec of ``SequenceState``: one Arrow IPC file, the same bytes in Beam state and on disk.

Schema (one row)::

    seq_id: string    position: int64    next_chunk: int64
    S: arrow.fixed_shape_tensor<float64|float32>[L, H, F, d_v]
    z: arrow.fixed_shape_tensor<float64|float32>[L, H, F]

Schema metadata: ``linstream.format_version``, ``linstream.min_reader_version``,
``linstream.fingerprint``, ``linstream.state_dtype`` and ``linstream.digest`` (``sha256:<hex>``
over the scalar fields, shapes, dtype, fingerprint and the little-endian tensor bytes; Arrow has
no checksum of its own).  A reader refuses a file whose minimum reader version is above
``READER_VERSION``; newer files that older readers may read set a lower minimum.

Decoding treats the bytes as untrusted: structure, schema, shapes and dtype are checked before any
array is touched, and the record batch headers before Arrow reads a batch (``ipc_bounds``: a
compressed body, which this codec never writes, is refused undecompressed, so no file makes a
reader allocate more than it holds), then fingerprint, identity, digest and finiteness.  Arrays
are zero-copy views of the (immutable) input buffer where Arrow allows.  No pickle.

A state that is not S and z alone (an fla model's: S, the short convolutions' tails) is written
in format 3, a column per named tensor and the layout in the metadata (``codec_named.py``); a
reader tells the two apart by the layout entry, and checks the rest the same way.

(About 550 lines: the encoder and the untrusted decoder of one format side by side, with every
check the decoder makes.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .arrow_tensors import DTYPES as _DTYPES
from .arrow_tensors import check_scalar_columns as _check_scalar_columns
from .arrow_tensors import little_endian as _le
from .arrow_tensors import read_tensor as _tensor
from .arrow_tensors import tensor_column as _tensor_column
from .arrow_tensors import tensor_column_shape as _tensor_column_shape
from .codec_named import (
    FORMAT_VERSION_NAMED,
    K_LAYOUT,
    MIN_READER_VERSION_NAMED,
    check_named_schema,
    named_batch,
    named_digest,
    read_named,
    state_named_digest,
)
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    ModelMismatchError,
    NonFiniteStateError,
    UnsupportedFormatVersionError,
)
from .ipc_bounds import check_state_file_bounds
from .layout import MAX_DIM as _MAX_DIM
from .layout import MAX_ELEMENTS as _MAX_ELEMENTS
from .layout import Layout, layout_from_json
from .sequence_state import SequenceState, zero_copy_of_immutable_buffers

__all__ = [
    "FORMAT_VERSION",
    "MIN_READER_VERSION",
    "READER_VERSION",
    "DigestHint",
    "StateHeader",
    "check_format_version",
    "decode_state",
    "decode_with_header",
    "digest_of_bytes",
    "encode_checked",
    "encode_state",
    "encode_state_buffer",
    "encode_with_digest",
    "state_digest",
    "tensor_ranges",
]

#: Format written by this version for states of S and z.  Format 2 (chained commits with a
#: history record in the manifest) keeps the data file's layout of format 1; format-1 files and
#: stores still restore.  States of other named tensors are written in format 3 (``codec_named``).
FORMAT_VERSION = 2
#: Oldest reader version able to read what this version writes (a format-1 reader would not see
#: format-2 commits at all, so it must not read their data files either).
MIN_READER_VERSION = 2
#: Newest format this reader understands (files whose minimum reader version exceeds it are
#: refused with ``UnsupportedFormatVersionError``).
READER_VERSION = 3

_K_FORMAT = b"linstream.format_version"
_K_MIN_READER = b"linstream.min_reader_version"
_K_FINGERPRINT = b"linstream.fingerprint"
_K_DTYPE = b"linstream.state_dtype"
_K_DIGEST = b"linstream.digest"
_COLUMNS = ("seq_id", "position", "next_chunk", "S", "z")
_INT_RE = re.compile(rb"[0-9]{1,9}")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class StateHeader:
    """What a state file says about itself (read from its schema metadata)."""

    format_version: int
    min_reader_version: int
    fingerprint: str
    dtype: str
    digest: str
    shape: tuple[int, ...]  # S's
    #: the named tensors of a format-3 state (None: S and z, format 1 or 2)
    layout: Layout | None = None


def state_digest(
    seq_id: str,
    position: int,
    next_chunk: int,
    fingerprint: str,
    S: np.ndarray,
    z: np.ndarray,
) -> str:
    """``sha256:<hex>`` over the scalar fields, shapes, dtype and the little-endian tensor bytes."""
    return digest_of_bytes(
        seq_id,
        position,
        next_chunk,
        fingerprint,
        str(S.dtype),
        S.shape,
        np.ascontiguousarray(_le(S)).data,
        np.ascontiguousarray(_le(z)).data,
    )


def digest_of_bytes(
    seq_id: str,
    position: int,
    next_chunk: int,
    fingerprint: str,
    dtype: str,
    shape: tuple[int, ...],
    S_bytes: Any,
    z_bytes: Any,
) -> str:
    """``state_digest`` from the raw little-endian tensor bytes (e.g. a slice of a file), for
    ``shape`` = S's shape (z's is ``shape[:3]``)."""
    head = {
        "seq_id": seq_id,
        "position": position,
        "next_chunk": next_chunk,
        "fingerprint": fingerprint,
        "dtype": dtype,
        "S": list(shape),
        "z": list(shape[:3]),
    }
    h = hashlib.sha256(b"linstream.state.v1\x00")
    h.update(json.dumps(head, sort_keys=True, ensure_ascii=True).encode("ascii") + b"\x00")
    h.update(S_bytes)
    h.update(z_bytes)
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True)
class DigestHint:
    """A content digest already computed over the bytes at ``S_address``/``z_address`` (inside
    the very buffer being decoded) for the given fields.  ``decode_with_header`` uses it instead
    of hashing the tensors again only when the decoded arrays are exactly those bytes and the
    decoded fields are exactly these: then it *is* the digest of the decoded content."""

    S_address: int
    S_nbytes: int
    z_address: int
    z_nbytes: int
    fields: tuple[str, int, int, str, str, tuple[int, ...]]  # seq_id .. dtype, S shape
    digest: str

    def covers(
        self, S: np.ndarray, z: np.ndarray, fields: tuple[str, int, int, str, str, tuple[int, ...]]
    ) -> bool:
        return (
            S.ctypes.data == self.S_address
            and S.nbytes == self.S_nbytes
            and z.ctypes.data == self.z_address
            and z.nbytes == self.z_nbytes
            and S.flags.c_contiguous
            and z.flags.c_contiguous
            and fields == self.fields
        )


def encode_state_buffer(st: SequenceState) -> pa.Buffer:
    """``encode_state`` without the final copy into ``bytes``."""
    return encode_with_digest(st)[0]


def encode_with_digest(st: SequenceState) -> tuple[pa.Buffer, str]:
    """The encoded state (an Arrow buffer) and the content digest written into it."""
    return encode_checked(st, finite_checked=False)


def encode_checked(st: SequenceState, *, finite_checked: bool) -> tuple[pa.Buffer, str]:
    """``encode_with_digest`` for callers that already refused non-finite values themselves
    (``finite_checked=True`` skips a second pass over the tensors)."""
    if not isinstance(st, SequenceState):
        msg = f"encode_state: expected a SequenceState, received {type(st).__name__}"
        raise TypeError(msg)
    if not finite_checked and not st.is_finite():
        msg = (
            f"sequence {st.seq_id!r} at position {st.position}: expected finite S and z, "
            "received NaN or Inf; refusing to encode"
        )
        raise NonFiniteStateError(msg)
    if not st.classic:
        return _encode_named(st)
    assert st.z is not None
    dtype = str(st.dtype)
    digest = state_digest(st.seq_id, st.position, st.next_chunk, st.fingerprint, st.S, st.z)
    metadata = {
        _K_FORMAT: str(FORMAT_VERSION).encode(),
        _K_MIN_READER: str(MIN_READER_VERSION).encode(),
        _K_FINGERPRINT: st.fingerprint.encode("utf-8"),
        _K_DTYPE: dtype.encode(),
        _K_DIGEST: digest.encode(),
    }
    S_col = _tensor_column(st.S)
    z_col = _tensor_column(st.z)
    schema = pa.schema(
        [
            pa.field("seq_id", pa.string(), nullable=False),
            pa.field("position", pa.int64(), nullable=False),
            pa.field("next_chunk", pa.int64(), nullable=False),
            pa.field("S", S_col.type, nullable=False),
            pa.field("z", z_col.type, nullable=False),
        ],
        metadata=metadata,
    )
    batch = pa.record_batch(
        [
            pa.array([st.seq_id], pa.string()),
            pa.array([st.position], pa.int64()),
            pa.array([st.next_chunk], pa.int64()),
            S_col,
            z_col,
        ],
        schema=schema,
    )
    return _write_file(batch), digest


def _write_file(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _encode_named(st: SequenceState) -> tuple[pa.Buffer, str]:
    """Format 3 (``codec_named``): a column per named tensor, the layout in the metadata."""
    digest = state_named_digest(st)
    metadata = {
        _K_FORMAT: str(FORMAT_VERSION_NAMED).encode(),
        _K_MIN_READER: str(MIN_READER_VERSION_NAMED).encode(),
        _K_FINGERPRINT: st.fingerprint.encode("utf-8"),
        _K_DTYPE: str(st.dtype).encode(),
        _K_DIGEST: digest.encode(),
    }
    return _write_file(named_batch(st, metadata)), digest


def format_versions(st: SequenceState) -> tuple[int, int]:
    """(format version, minimum reader version) ``encode_checked`` writes ``st`` in."""
    if st.classic:
        return FORMAT_VERSION, MIN_READER_VERSION
    return FORMAT_VERSION_NAMED, MIN_READER_VERSION_NAMED


def tensor_ranges(buf: pa.Buffer, st: SequenceState) -> tuple[int, int, int, int] | None:
    """Where ``encode_checked`` put S and z inside ``buf``: ``(S offset, S bytes, z offset,
    z bytes)``, or None if the layout is not S then z (then no split hash is written)."""
    if not st.classic:
        return None
    try:
        batch = pa.ipc.open_file(buf).get_batch(0)
        dtype = str(st.dtype)
        S = _tensor(batch, "S", st.state_shape, dtype)
        z = _tensor(batch, "z", st.state_shape[:3], dtype)
    except (pa.ArrowException, CheckpointError, ValueError):
        return None
    s_off, z_off = S.ctypes.data - buf.address, z.ctypes.data - buf.address
    if not (s_off >= 0 and s_off + S.nbytes <= z_off and z_off + z.nbytes <= buf.size):
        return None
    return s_off, S.nbytes, z_off, z.nbytes


def encode_state(st: SequenceState) -> bytes:
    """The state as Arrow IPC file bytes (refuses NaN/Inf with ``NonFiniteStateError``)."""
    return encode_state_buffer(st).to_pybytes()


# --- decoding ------------------------------------------------------------------------------


def _corrupt(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(msg)


def _meta_int(meta: dict[bytes, bytes], key: bytes) -> int:
    raw = meta.get(key)
    if raw is None or not _INT_RE.fullmatch(raw):
        msg = f"schema metadata {key.decode()}: expected a decimal integer, received {raw!r}"
        raise _corrupt(msg)
    return int(raw)


def check_format_version(found: int, min_reader: int) -> None:
    """Raise ``UnsupportedFormatVersionError`` when this reader cannot read ``found``."""
    if min_reader > READER_VERSION or min_reader > found or found < 1:
        msg = (
            f"written in checkpoint format version {found} (needs a reader of version "
            f">= {min_reader}); this linstream reads format versions 1 to {READER_VERSION}"
        )
        raise UnsupportedFormatVersionError(msg, found=found, supported=READER_VERSION)


def _open(data: Any) -> pa.RecordBatchFileReader:
    try:
        return pa.ipc.open_file(pa.py_buffer(data))
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError) as ex:
        msg = f"not a readable Arrow IPC file ({len(data)} bytes): {ex}"
        raise _corrupt(msg) from ex


def _header(schema: pa.Schema) -> StateHeader:
    meta = dict(schema.metadata or {})
    found = _meta_int(meta, _K_FORMAT)
    min_reader = _meta_int(meta, _K_MIN_READER)
    check_format_version(found, min_reader)
    try:
        fingerprint = meta[_K_FINGERPRINT].decode("utf-8")
        dtype = meta[_K_DTYPE].decode("ascii")
        digest = meta[_K_DIGEST].decode("ascii")
    except (KeyError, UnicodeDecodeError) as ex:
        msg = f"schema metadata: expected fingerprint, state_dtype and digest, received {ex!r}"
        raise _corrupt(msg) from ex
    if dtype not in _DTYPES:
        msg = f"schema metadata state_dtype: expected float64 or float32, received {dtype!r}"
        raise _corrupt(msg)
    if not _DIGEST_RE.fullmatch(digest):
        msg = f"schema metadata digest: expected 'sha256:<64 hex>', received {digest[:80]!r}"
        raise _corrupt(msg)
    if K_LAYOUT in meta:
        layout = _layout(meta[K_LAYOUT], found)
        check_named_schema(schema, dtype, layout)
        return StateHeader(found, min_reader, fingerprint, dtype, digest, layout[0][1], layout)
    shape = _check_schema(schema, dtype)
    return StateHeader(found, min_reader, fingerprint, dtype, digest, shape)


def _layout(raw: bytes, found: int) -> Layout:
    if found < FORMAT_VERSION_NAMED:
        msg = (
            f"schema metadata: a layout of named tensors in a file of format {found} (they "
            f"came with format {FORMAT_VERSION_NAMED})"
        )
        raise _corrupt(msg)
    try:
        return layout_from_json(raw)
    except ValueError as ex:
        msg = f"schema metadata {K_LAYOUT.decode()}: {ex}"
        raise _corrupt(msg) from ex


def _check_schema(schema: pa.Schema, dtype: str) -> tuple[int, ...]:
    names = tuple(schema.names)
    if names != _COLUMNS:
        msg = f"schema: expected columns {list(_COLUMNS)}, received {list(names)}"
        raise _corrupt(msg)
    _check_scalar_columns(schema)
    shapes = []
    for name, ndim in (("S", 4), ("z", 3)):
        shape = _tensor_column_shape(schema, name, dtype)
        if len(shape) != ndim or not all(1 <= n <= _MAX_DIM for n in shape):
            msg = (
                f"column {name}: expected a shape of {ndim} dimensions in 1..{_MAX_DIM}, "
                f"received {list(shape)}"
            )
            raise _corrupt(msg)
        shapes.append(shape)
    S_shape, z_shape = shapes
    if S_shape[:3] != z_shape:
        msg = f"shapes: expected z [L, H, F] = S[:3] {list(S_shape[:3])}, received {list(z_shape)}"
        raise _corrupt(msg)
    if math.prod(S_shape) > _MAX_ELEMENTS:
        msg = f"shape {list(S_shape)}: more than {_MAX_ELEMENTS} elements"
        raise _corrupt(msg)
    return S_shape


def _check_bounds(data: Any, header: StateHeader) -> None:
    """Before Arrow reads a batch: nothing it would allocate may exceed what the file holds
    (a compressed body is refused undecompressed; ``ipc_bounds``)."""
    try:
        check_state_file_bounds(data, shape=header.shape, itemsize=_DTYPES[header.dtype].itemsize)
    except ValueError as ex:
        msg = f"not a readable Arrow IPC file ({len(data)} bytes): {ex}"
        raise _corrupt(msg) from ex


def decode_state(
    data: bytes | bytearray | memoryview | pa.Buffer,
    *,
    expected_fingerprint: str | None = None,
    expected_seq_id: str | None = None,
    expected_position: int | None = None,
    expected_next_chunk: int | None = None,
) -> SequenceState:
    """Decode and check an ``encode_state`` result (untrusted input).

    Checks, in order: Arrow structure, format version, schema, shapes and dtype, model
    fingerprint, sequence id and position, digest, finite values.  Raises
    ``CorruptCheckpointError``, ``UnsupportedFormatVersionError`` or ``ModelMismatchError``.
    Arrays are read-only zero-copy views when ``data`` is immutable (bytes, Arrow buffer).
    """
    return decode_with_header(
        data,
        expected_fingerprint=expected_fingerprint,
        expected_seq_id=expected_seq_id,
        expected_position=expected_position,
        expected_next_chunk=expected_next_chunk,
    )[0]


def decode_with_header(
    data: bytes | bytearray | memoryview | pa.Buffer,
    *,
    expected_fingerprint: str | None = None,
    expected_seq_id: str | None = None,
    expected_position: int | None = None,
    expected_next_chunk: int | None = None,
    digest_hint: DigestHint | None = None,
) -> tuple[SequenceState, StateHeader]:
    """``decode_state`` that also returns what the file's metadata says (``StateHeader``).

    ``digest_hint``: the content digest of tensor bytes the caller already hashed (see
    ``DigestHint``); the digest is still compared, at its place in the order of checks."""
    if not isinstance(data, bytes | bytearray | memoryview | pa.Buffer):
        msg = f"decode_state: expected bytes, received {type(data).__name__}"
        raise TypeError(msg)
    if not isinstance(data, bytes) and not (isinstance(data, pa.Buffer) and not data.is_mutable):
        data = bytes(data)  # zero-copy views only of memory nobody can change
    reader = _open(data)
    try:
        header = _header(reader.schema)
    except (UnicodeDecodeError, pa.ArrowException, ValueError, TypeError) as ex:
        # e.g. a column name that is not UTF-8 (found by tests/state/test_fuzz_decoders.py)
        msg = f"schema does not decode: {type(ex).__name__}: {ex}"
        raise _corrupt(msg) from ex
    _check_bounds(data, header)
    try:
        if reader.num_record_batches != 1:
            msg = f"expected 1 record batch, received {reader.num_record_batches}"
            raise _corrupt(msg)
        batch = reader.get_batch(0)
        batch.validate(full=True)
    except CheckpointError:
        raise
    except (pa.ArrowException, OSError, ValueError, IndexError) as ex:
        msg = f"damaged Arrow record batch: {ex}"
        raise _corrupt(msg) from ex
    if batch.num_rows != 1 or any(c.null_count for c in batch.columns):
        msg = f"expected 1 row without nulls, received {batch.num_rows} rows"
        raise _corrupt(msg)
    if header.layout is None:
        tensors = {
            "S": _tensor(batch, "S", header.shape, header.dtype),
            "z": _tensor(batch, "z", header.shape[:3], header.dtype),
        }
    else:
        tensors = read_named(batch, header.layout, header.dtype)
    seq_id = batch.column("seq_id")[0].as_py()
    position = batch.column("position")[0].as_py()
    next_chunk = batch.column("next_chunk")[0].as_py()
    if position < 0 or next_chunk < 0:
        msg = f"position and next_chunk: expected >= 0, received {position} and {next_chunk}"
        raise _corrupt(msg)
    if expected_fingerprint is not None and header.fingerprint != expected_fingerprint:
        msg = (
            f"state of another model: expected fingerprint {expected_fingerprint[:16]}…, "
            f"received {header.fingerprint[:16]}…"
        )
        raise ModelMismatchError(msg, expected=expected_fingerprint, found=header.fingerprint)
    for what, want, got in (
        ("sequence id", expected_seq_id, seq_id),
        ("position", expected_position, position),
        ("next chunk", expected_next_chunk, next_chunk),
    ):
        if want is not None and want != got:
            msg = f"{what}: expected {want!r}, received {got!r}"
            raise _corrupt(msg)
    fields = (seq_id, position, next_chunk, header.fingerprint, header.dtype, header.shape)
    S, z = tensors.pop("S"), tensors.pop("z", None)
    if header.layout is not None:
        digest = named_digest(
            *fields[:5],
            header.layout,
            (a.data for a in (S, *([] if z is None else [z]), *tensors.values())),
        )
    elif digest_hint is not None and z is not None and digest_hint.covers(S, z, fields):
        digest = digest_hint.digest  # computed over these very bytes moments ago (one pass)
    else:
        assert z is not None
        digest = state_digest(seq_id, position, next_chunk, header.fingerprint, S, z)
    if not hmac.compare_digest(digest, header.digest):
        msg = (
            f"content digest mismatch (damaged tensor data or fields): expected "
            f"{header.digest[:23]}…, computed {digest[:23]}…"
        )
        raise _corrupt(msg)
    for name, a in (("S", S), ("z", z), *tensors.items()):
        if a is not None and not np.isfinite(a).all():
            msg = (
                "expected finite S and z, received NaN or Inf"
                if header.layout is None
                else f"expected finite tensors, received NaN or Inf in {name}"
            )
            raise _corrupt(msg)
    with zero_copy_of_immutable_buffers():
        st = SequenceState(seq_id, position, next_chunk, S, z, header.fingerprint, tensors)
    return st, header
