"""The pipeline's values, `Chunk`, `ChunkResult` and `DeadLetter`, and their fixed binary layout.

The layout is little-endian binary (no pickle), so equal values always encode to equal bytes:
Beam's coders (elements.py, which registers them for these classes) write it for keys, state
and shuffles on any runner, and the stateful stage's cells hold it.  No Beam here: the sequence
engine and the one-line API use these values without importing it.

Array layout: dtype string (e.g. ``<f4``), rank, shape, then the C-ordered little-endian bytes.
A payload that is not a numeric array (a ragged list, strings, objects) is carried as its repr
under the kind `unencodable`, so that the stateful stage can dead-letter it instead of the
coder failing the bundle.

(About 450 lines: the three values and the one layout they share.)
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "Chunk",
    "ChunkResult",
    "DeadLetter",
    "Rejected",
    "Unencodable",
    "decode_chunk",
    "decode_dead_letter",
    "decode_result",
    "encode_chunk",
    "encode_dead_letter",
    "encode_result",
]

_LAYOUT_VERSION = 1


class Unencodable:
    """Stand-in for a payload that has no array form; the stateful stage dead-letters it."""

    __slots__ = ("description",)

    def __init__(self, description: str) -> None:
        self.description = description

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unencodable) and other.description == self.description

    def __hash__(self) -> int:
        return hash(self.description)

    def __repr__(self) -> str:
        return f"Unencodable({self.description!r})"


class Rejected(Unencodable):
    """A row that is no chunk of any sequence (no usable seq_id, or a file that cannot be read):
    the transforms send it to the dead letters with its own ``reason`` before keying, so it never
    reaches the stateful stage as a sequence.  (A stage that met one anyway would dead-letter it
    as a payload without array form.)"""

    __slots__ = ("reason",)

    def __init__(self, reason: str, description: str) -> None:
        super().__init__(description)
        self.reason = reason

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rejected) and (other.reason, other.description) == (
            self.reason,
            self.description,
        )

    def __hash__(self) -> int:
        return hash((self.reason, self.description))

    def __repr__(self) -> str:
        return f"Rejected({self.reason!r}, {self.description!r})"


def _payload_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_payload_equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        return (
            a_arr.dtype == b_arr.dtype
            and a_arr.shape == b_arr.shape
            and bool(np.array_equal(a_arr, b_arr, equal_nan=a_arr.dtype.kind in "fc"))
        )
    return bool(a == b)


class Chunk:
    """One chunk of a sequence.

    seq_id: the sequence's id.  index: 0-based position of the chunk in its sequence (chunks
    are contiguous; an index that is not an int >= 0 is dead-lettered).  data: for
    `CausalLinearAttention` a mapping {"q": [T, H, d_k], "k": [T, H, d_k], "v": [T, H, d_v]};
    for `EmbedSequences` token ids [T] or feature vectors [T, input_dim].
    final: True on the sequence's last chunk.
    """

    __slots__ = ("data", "final", "index", "seq_id")

    def __init__(self, seq_id: str, index: Any, data: Any, final: bool = False) -> None:
        self.seq_id = seq_id
        self.index = index
        self.data = data
        self.final = bool(final)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Chunk)
            and (self.seq_id, self.index, self.final) == (other.seq_id, other.index, other.final)
            and type(self.index) is type(other.index)
            and _payload_equal(self.data, other.data)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable array payload: not hashable

    def __repr__(self) -> str:
        return (
            f"Chunk(seq_id={self.seq_id!r}, index={self.index!r}, "
            f"data={_describe(self.data)}, final={self.final})"
        )


class ChunkResult:
    """The output for one applied chunk.

    start_position: tokens of the sequence before this chunk.  output: per-token outputs
    ([T, d_model] embeddings, or [T, H, d_v] for raw attention) or one vector per chunk when the
    transform emits `mean` or `last`.
    """

    __slots__ = ("index", "output", "seq_id", "start_position")

    def __init__(self, seq_id: str, index: int, start_position: int, output: np.ndarray) -> None:
        self.seq_id = seq_id
        self.index = index
        self.start_position = start_position
        self.output = output

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ChunkResult)
            and (self.seq_id, self.index, self.start_position)
            == (other.seq_id, other.index, other.start_position)
            and _payload_equal(self.output, other.output)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ChunkResult(seq_id={self.seq_id!r}, index={self.index}, "
            f"start_position={self.start_position}, output={_describe(self.output)})"
        )


class DeadLetter:
    """A rejected input: its sequence, chunk index (None when it was not an integer), why, what."""

    __slots__ = ("chunk_index", "message", "reason", "seq_id")

    def __init__(self, seq_id: str, chunk_index: int | None, reason: str, message: str) -> None:
        self.seq_id = seq_id
        self.chunk_index = chunk_index
        self.reason = reason
        self.message = message

    def _key(self) -> tuple[str, int | None, str, str]:
        return (self.seq_id, self.chunk_index, self.reason, self.message)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeadLetter) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __iter__(self) -> Any:
        return iter(self._key())

    def __repr__(self) -> str:
        return (
            f"DeadLetter(seq_id={self.seq_id!r}, chunk_index={self.chunk_index!r}, "
            f"reason={self.reason!r}, message={self.message!r})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq_id": self.seq_id,
            "chunk_index": self.chunk_index,
            "reason": self.reason,
            "message": self.message,
        }


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"array{list(x.shape)}:{x.dtype}"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in x.items()) + "}"
    return repr(x)[:80]


# --- binary layout -------------------------------------------------------------------------

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

_IDX_INT, _IDX_FLOAT, _IDX_OTHER, _IDX_NONE = 0, 1, 2, 3
_DATA_NONE, _DATA_ARRAY, _DATA_DICT, _DATA_UNENCODABLE, _DATA_REJECTED = 0, 1, 2, 3, 4


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, x: int) -> None:
        self.parts.append(_U8.pack(x))

    def u32(self, x: int) -> None:
        self.parts.append(_U32.pack(x))

    def i64(self, x: int) -> None:
        self.parts.append(_I64.pack(x))

    def text(self, s: str) -> None:
        b = s.encode("utf-8", "surrogatepass")
        self.u32(len(b))
        self.parts.append(b)

    def array(self, a: np.ndarray) -> None:
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        a = np.ascontiguousarray(a, dtype=dt)
        self.text(dt.str)
        self.u8(a.ndim)
        for n in a.shape:
            self.i64(n)
        self.parts.append(a.tobytes())

    def index(self, idx: Any) -> None:
        if isinstance(idx, (bool, np.bool_)):
            self.u8(_IDX_OTHER)
            self.text(repr(bool(idx)))
        elif isinstance(idx, (int, np.integer)) and -(2**63) <= int(idx) < 2**63:
            self.u8(_IDX_INT)
            self.i64(int(idx))
        elif isinstance(idx, (float, np.floating)):
            self.u8(_IDX_FLOAT)
            self.parts.append(_F64.pack(float(idx)))
        elif idx is None:
            self.u8(_IDX_NONE)
        else:
            self.u8(_IDX_OTHER)
            self.text(repr(idx))

    def payload(self, data: Any) -> None:
        if data is None:
            self.u8(_DATA_NONE)
        elif isinstance(data, Rejected):
            self.u8(_DATA_REJECTED)
            self.text(data.reason)
            self.text(data.description)
        elif isinstance(data, Unencodable):
            self.u8(_DATA_UNENCODABLE)
            self.text(data.description)
        elif isinstance(data, Mapping):
            if not all(isinstance(k, str) for k in data):
                self.u8(_DATA_UNENCODABLE)
                self.text(f"mapping with non-string keys {sorted(map(repr, data))}")
                return
            self.u8(_DATA_DICT)
            self.u32(len(data))
            for key in sorted(data):
                self.text(key)
                self.payload(data[key])
        else:
            arr = _as_plain_array(data)
            if arr is None:
                self.u8(_DATA_UNENCODABLE)
                self.text(_describe_unencodable(data))
            else:
                self.u8(_DATA_ARRAY)
                self.array(arr)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


def _as_plain_array(data: Any) -> np.ndarray | None:
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        return None
    if arr.dtype.kind not in "biuf" or arr.dtype.hasobject:
        return None
    return arr


def _describe_unencodable(data: Any) -> str:
    """One line (it ends up in a dead letter's message)."""
    if isinstance(data, np.ndarray):
        return f"array of shape {list(data.shape)} and dtype {data.dtype}"
    try:
        arr = np.asarray(data, dtype=object)
        shape = f" of shape {list(arr.shape)}"
    except (ValueError, TypeError):
        shape = ""
    text = " ".join(repr(data).split())
    if len(text) > 120:
        text = text[:117] + "..."
    return f"{type(data).__name__}{shape}: {text}"


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            msg = f"truncated element: needed {n} bytes at offset {self.pos}, have {len(self.data)}"
            raise ValueError(msg)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return int(_U8.unpack(self._take(1))[0])

    def u32(self) -> int:
        return int(_U32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def text(self) -> str:
        n = self.u32()
        return bytes(self._take(n)).decode("utf-8", "surrogatepass")

    def array(self) -> np.ndarray:
        dt = np.dtype(self.text())
        ndim = self.u8()
        shape = tuple(self.i64() for _ in range(ndim))
        count = int(np.prod(shape, dtype=np.int64))
        raw = self._take(count * dt.itemsize)
        # A copy: the element outlives the input buffer and must be writable.
        return np.frombuffer(raw, dtype=dt, count=count).reshape(shape).copy()

    def index(self) -> Any:
        kind = self.u8()
        if kind == _IDX_INT:
            return self.i64()
        if kind == _IDX_FLOAT:
            return float(_F64.unpack(self._take(8))[0])
        if kind == _IDX_NONE:
            return None
        return _ReprIndex(self.text())

    def payload(self) -> Any:
        kind = self.u8()
        if kind == _DATA_NONE:
            return None
        if kind == _DATA_UNENCODABLE:
            return Unencodable(self.text())
        if kind == _DATA_REJECTED:
            reason = self.text()
            return Rejected(reason, self.text())
        if kind == _DATA_DICT:
            n = self.u32()
            return {self.text(): self.payload() for _ in range(n)}
        if kind == _DATA_ARRAY:
            return self.array()
        msg = f"unknown payload kind {kind} in an encoded element"
        raise ValueError(msg)

    def version(self, what: str) -> None:
        v = self.u8()
        if v != _LAYOUT_VERSION:
            msg = f"{what} encoded with layout version {v}; this reader knows {_LAYOUT_VERSION}"
            raise ValueError(msg)


class _ReprIndex(str):
    """A chunk index that was neither an integer nor a float, kept as its repr (dead-lettered)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def encode_chunk(value: Chunk) -> bytes:
    w = _Writer()
    w.u8(_LAYOUT_VERSION)
    w.text(str(value.seq_id))
    w.index(value.index)
    w.u8(1 if value.final else 0)
    w.payload(value.data)
    return w.getvalue()


def decode_chunk(encoded: bytes) -> Chunk:
    r = _Reader(encoded)
    r.version("Chunk")
    seq_id = r.text()
    index = r.index()
    final = bool(r.u8())
    return Chunk(seq_id, index, r.payload(), final)


def encode_result(value: ChunkResult) -> bytes:
    w = _Writer()
    w.u8(_LAYOUT_VERSION)
    w.text(value.seq_id)
    w.i64(int(value.index))
    w.i64(int(value.start_position))
    w.array(np.asarray(value.output))
    return w.getvalue()


def decode_result(encoded: bytes) -> ChunkResult:
    r = _Reader(encoded)
    r.version("ChunkResult")
    seq_id = r.text()
    index = r.i64()
    start = r.i64()
    return ChunkResult(seq_id, index, start, r.array())


def encode_dead_letter(value: DeadLetter) -> bytes:
    w = _Writer()
    w.u8(_LAYOUT_VERSION)
    w.text(value.seq_id)
    w.index(value.chunk_index)
    w.text(value.reason)
    w.text(value.message)
    return w.getvalue()


def decode_dead_letter(encoded: bytes) -> DeadLetter:
    r = _Reader(encoded)
    r.version("DeadLetter")
    seq_id = r.text()
    idx = r.index()
    reason = r.text()
    return DeadLetter(seq_id, idx if isinstance(idx, int) else None, reason, r.text())
