"""The per-sequence state value: an immutable snapshot of every layer's (S, z) after a prefix.

S is ``[L, H, F, d_v]`` and z is ``[L, H, F]`` (F = feature-mapped key width, d_v = value width),
float64 by default, float32 allowed.  The arrays are read-only: a value built from writable
arrays copies them, so no later write by the caller can change a state that was encoded or
committed.  Arrays decoded from immutable Arrow buffers are kept as they are (zero-copy).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from linstream.ops import AttentionState

__all__ = ["STATE_DTYPES", "SequenceState"]

#: The dtypes a carried state may have.
STATE_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.float64), np.dtype(np.float32))


def _check_dtype(dtype: npt.DTypeLike, what: str) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind != "f" or dt.newbyteorder("=") not in STATE_DTYPES:
        msg = f"{what}: expected dtype float64 or float32, received {dt}"
        raise TypeError(msg)
    return dt.newbyteorder("=")


def _owner_is_immutable(a: np.ndarray) -> bool:
    """True when no writable array or buffer can reach ``a``'s memory."""
    obj: Any = a
    while isinstance(obj, np.ndarray):
        if obj.flags.writeable:
            return False
        obj = obj.base
    if obj is None or isinstance(obj, bytes):
        return True
    if isinstance(obj, memoryview):
        return obj.readonly and isinstance(obj.obj, bytes)
    return False


# Set by the codec while it builds a value over an immutable buffer it owns (zero-copy).
_ZERO_COPY: contextvars.ContextVar[bool] = contextvars.ContextVar("zero_copy", default=False)


@contextlib.contextmanager
def zero_copy_of_immutable_buffers() -> Iterator[None]:
    """Within this block, read-only input arrays are kept as they are (the caller guarantees
    that their memory is immutable, e.g. a view of ``bytes``)."""
    token = _ZERO_COPY.set(True)
    try:
        yield
    finally:
        _ZERO_COPY.reset(token)


def _frozen(a: npt.ArrayLike, dtype: np.dtype) -> np.ndarray:
    arr = np.asarray(a)
    if (
        arr.dtype == dtype
        and arr.flags.c_contiguous
        and isinstance(a, np.ndarray)
        and not arr.flags.writeable
        and (_ZERO_COPY.get() or _owner_is_immutable(arr))
    ):
        return arr
    out = np.array(arr, dtype=dtype, order="C", copy=True)
    out.setflags(write=False)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class SequenceState:
    """Immutable state of one sequence after ``position`` tokens (chunks ``0..next_chunk-1``).

    seq_id: the sequence id (any string).  position: tokens consumed.  next_chunk: index of the
    next chunk to apply.  S: ``[L, H, F, d_v]``.  z: ``[L, H, F]``.  fingerprint: the model's
    fingerprint (config + weights + feature-map parameters).

    Equality is bit-exact (``==``); ``dataclasses.replace(st, ...)`` makes a changed copy.
    """

    seq_id: str
    position: int
    next_chunk: int
    S: np.ndarray
    z: np.ndarray
    fingerprint: str

    def __post_init__(self) -> None:
        if not isinstance(self.seq_id, str):
            msg = f"seq_id: expected str, received {type(self.seq_id).__name__}"
            raise TypeError(msg)
        try:
            self.seq_id.encode("utf-8")
        except UnicodeEncodeError as ex:
            msg = f"seq_id: expected a string encodable as UTF-8, received {self.seq_id!r}"
            raise ValueError(msg) from ex
        for name in ("position", "next_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                msg = f"{name}: expected int, received {type(value).__name__}"
                raise TypeError(msg)
            if not 0 <= int(value) < 2**63:
                msg = f"{name}: expected 0 <= {name} < 2**63, received {value}"
                raise ValueError(msg)
            object.__setattr__(self, name, int(value))
        if not isinstance(self.fingerprint, str):
            msg = f"fingerprint: expected str, received {type(self.fingerprint).__name__}"
            raise TypeError(msg)
        if not isinstance(self.S, np.ndarray) or not isinstance(self.z, np.ndarray):
            msg = (
                "S and z: expected numpy arrays, received "
                f"{type(self.S).__name__} and {type(self.z).__name__}"
            )
            raise TypeError(msg)
        dtype = _check_dtype(self.S.dtype, "S")
        if _check_dtype(self.z.dtype, "z") != dtype:
            msg = f"S and z: expected the same dtype, received {self.S.dtype} and {self.z.dtype}"
            raise TypeError(msg)
        if self.S.ndim != 4 or self.z.ndim != 3 or self.S.shape[:3] != self.z.shape:
            msg = (
                "S and z: expected S [L, H, F, d_v] and z [L, H, F], "
                f"received S {list(self.S.shape)} and z {list(self.z.shape)}"
            )
            raise ValueError(msg)
        if min(self.S.shape) < 1:
            msg = f"S: expected every dimension >= 1, received {list(self.S.shape)}"
            raise ValueError(msg)
        object.__setattr__(self, "S", _frozen(self.S, dtype))
        object.__setattr__(self, "z", _frozen(self.z, dtype))

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_layers(
        cls,
        seq_id: str,
        position: int,
        next_chunk: int,
        layers: Sequence[AttentionState],
        fingerprint: str,
        *,
        dtype: npt.DTypeLike | None = None,
    ) -> SequenceState:
        """Stack per-layer ``AttentionState`` (S [H, F, d_v], z [H, F]) into one value (copied)."""
        if len(layers) == 0:
            msg = "layers: expected at least one AttentionState, received none"
            raise ValueError(msg)
        first = layers[0]
        dt = _check_dtype(first.S.dtype if dtype is None else dtype, "layers")
        for i, layer in enumerate(layers):
            if layer.S.shape != first.S.shape or layer.z.shape != first.z.shape:
                msg = (
                    f"layers[{i}]: expected S {list(first.S.shape)} and z {list(first.z.shape)} "
                    f"like layer 0, received S {list(layer.S.shape)} and z {list(layer.z.shape)}"
                )
                raise ValueError(msg)
            if dtype is None and (layer.S.dtype != dt or layer.z.dtype != dt):
                msg = (
                    f"layers[{i}]: expected dtype {dt} like layer 0, "
                    f"received S {layer.S.dtype} and z {layer.z.dtype}"
                )
                raise TypeError(msg)
        S = np.stack([np.asarray(layer.S, dtype=dt) for layer in layers])
        z = np.stack([np.asarray(layer.z, dtype=dt) for layer in layers])
        S.setflags(write=False)
        z.setflags(write=False)
        return cls(seq_id, position, next_chunk, S, z, fingerprint)

    @classmethod
    def initial(
        cls,
        seq_id: str,
        state_shape: Sequence[int],
        fingerprint: str,
        dtype: npt.DTypeLike = np.float64,
    ) -> SequenceState:
        """The zero state of a new sequence; ``state_shape`` is ``(L, H, F, d_v)``."""
        shape = tuple(int(n) for n in state_shape)
        if len(shape) != 4:
            msg = f"state_shape: expected (L, H, F, d_v), received {tuple(state_shape)}"
            raise ValueError(msg)
        dt = _check_dtype(dtype, "dtype")
        S = np.zeros(shape, dtype=dt)
        z = np.zeros(shape[:3], dtype=dt)
        S.setflags(write=False)
        z.setflags(write=False)
        return cls(seq_id, 0, 0, S, z, fingerprint)

    def advanced(
        self, layers: Sequence[AttentionState], *, tokens: int, chunks: int = 1
    ) -> SequenceState:
        """The state after ``chunks`` more chunks holding ``tokens`` more tokens."""
        if tokens < 0 or chunks < 0:
            msg = f"tokens and chunks: expected >= 0, received {tokens} and {chunks}"
            raise ValueError(msg)
        return SequenceState.from_layers(
            self.seq_id,
            self.position + tokens,
            self.next_chunk + chunks,
            layers,
            self.fingerprint,
            dtype=self.dtype,
        )

    # --- views -------------------------------------------------------------------------------

    @property
    def dtype(self) -> np.dtype:
        return self.S.dtype

    @property
    def state_shape(self) -> tuple[int, int, int, int]:
        """``(L, H, F, d_v)``."""
        L, H, F, dv = self.S.shape
        return (L, H, F, dv)

    @property
    def nbytes(self) -> int:
        return int(self.S.nbytes + self.z.nbytes)

    def layers(self, *, copy: bool = False) -> list[AttentionState]:
        """Per-layer ``AttentionState``: read-only views, or writable copies with ``copy=True``."""
        if copy:
            return [AttentionState(self.S[i].copy(), self.z[i].copy()) for i in range(len(self.S))]
        return [AttentionState(self.S[i], self.z[i]) for i in range(len(self.S))]

    def is_finite(self) -> bool:
        return bool(np.isfinite(self.S).all() and np.isfinite(self.z).all())

    def norms(self) -> tuple[float, float]:
        """Frobenius norms of S and z over all layers (for display)."""
        return float(np.linalg.norm(self.S.ravel())), float(np.linalg.norm(self.z.ravel()))

    # --- equality ----------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SequenceState):
            return NotImplemented
        return (
            self.seq_id == other.seq_id
            and self.position == other.position
            and self.next_chunk == other.next_chunk
            and self.fingerprint == other.fingerprint
            and self.dtype == other.dtype
            and self.S.shape == other.S.shape
            and self.S.tobytes() == other.S.tobytes()
            and self.z.tobytes() == other.z.tobytes()
        )

    def __hash__(self) -> int:
        return hash((self.seq_id, self.position, self.next_chunk, self.fingerprint))

    def __repr__(self) -> str:
        return (
            f"SequenceState(seq_id={self.seq_id!r}, position={self.position}, "
            f"next_chunk={self.next_chunk}, shape={list(self.S.shape)}, dtype={self.dtype}, "
            f"fingerprint={self.fingerprint[:12]!r})"
        )
