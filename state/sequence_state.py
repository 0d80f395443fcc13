"""The per-sequence state value: an immutable snapshot of every layer's carried tensors after a
prefix.

The built-in model and raw attention carry S ``[L, H, F, d_v]`` and z ``[L, H, F]`` (F =
feature-mapped key width, d_v = value width).  Other models carry S without z, and named tensors
beside it (``extra``: an fla model's short-convolution tails ``conv_q`` [L, W−1, D] ...); every
tensor has the layers first and a size fixed whatever the sequence's length (``layout.py``).
Float64 by default, float32 allowed, one dtype for all.  The arrays are read-only: a value built
from writable arrays copies them, so no later write by the caller can change a state that was
encoded or committed.  Arrays decoded from immutable Arrow buffers are kept as they are
(zero-copy).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from linstream.ops import AttentionState

from .layout import NAME_RE, Layout, check_layout

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
    next chunk to apply.  S: ``[L, H, F, d_v]``.  z: ``[L, H, F]``, or None for a model whose
    rule has none.  fingerprint: the model's fingerprint (config + weights + feature-map
    parameters).  extra: further named tensors ``[L, ...]`` (names: ``layout.NAME_RE``), in
    order.  A state of S and z alone (``classic``) is written as checkpoint format 2; any other
    as format 3.

    Equality is bit-exact (``==``); ``dataclasses.replace(st, ...)`` makes a changed copy.
    """

    seq_id: str
    position: int
    next_chunk: int
    S: np.ndarray
    z: np.ndarray | None
    fingerprint: str
    extra: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

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
        z_ok = self.z is None or isinstance(self.z, np.ndarray)
        if not isinstance(self.S, np.ndarray) or not z_ok:
            msg = (
                "S and z: expected numpy arrays, received "
                f"{type(self.S).__name__} and {type(self.z).__name__}"
            )
            raise TypeError(msg)
        dtype = _check_dtype(self.S.dtype, "S")
        if self.z is not None and _check_dtype(self.z.dtype, "z") != dtype:
            msg = f"S and z: expected the same dtype, received {self.S.dtype} and {self.z.dtype}"
            raise TypeError(msg)
        if self.S.ndim != 4 or (
            self.z is not None and (self.z.ndim != 3 or self.S.shape[:3] != self.z.shape)
        ):
            z_shape = None if self.z is None else list(self.z.shape)
            msg = (
                "S and z: expected S [L, H, F, d_v] and z [L, H, F], "
                f"received S {list(self.S.shape)} and z {z_shape}"
            )
            raise ValueError(msg)
        if min(self.S.shape) < 1:
            msg = f"S: expected every dimension >= 1, received {list(self.S.shape)}"
            raise ValueError(msg)
        object.__setattr__(self, "S", _frozen(self.S, dtype))
        if self.z is not None:
            object.__setattr__(self, "z", _frozen(self.z, dtype))
        object.__setattr__(self, "extra", self._checked_extra(dtype))

    def _checked_extra(self, dtype: np.dtype) -> Mapping[str, np.ndarray]:
        if not isinstance(self.extra, Mapping):
            msg = f"extra: expected a mapping of names to arrays, received {type(self.extra)}"
            raise TypeError(msg)
        out: dict[str, np.ndarray] = {}
        for name, a in self.extra.items():
            if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in ("S", "z"):
                msg = f"extra: expected lowercase tensor names other than z, received {name!r}"
                raise ValueError(msg)
            if not isinstance(a, np.ndarray):
                msg = f"extra[{name!r}]: expected a numpy array, received {type(a).__name__}"
                raise TypeError(msg)
            if _check_dtype(a.dtype, f"extra[{name!r}]") != dtype:
                msg = f"extra[{name!r}]: expected the dtype of S ({dtype}), received {a.dtype}"
                raise TypeError(msg)
            if a.ndim < 1 or a.shape[0] != self.S.shape[0] or min(a.shape) < 1:
                msg = (
                    f"extra[{name!r}]: expected [L = {self.S.shape[0]}, ...] with every "
                    f"dimension >= 1, received {list(a.shape)}"
                )
                raise ValueError(msg)
            out[name] = _frozen(a, dtype)
        return types.MappingProxyType(out)

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_layers(
        cls,
        seq_id: str,
        position: int,
        next_chunk: int,
        layers: Sequence[AttentionState] | Sequence[Mapping[str, np.ndarray]],
        fingerprint: str,
        *,
        dtype: npt.DTypeLike | None = None,
    ) -> SequenceState:
        """Stack per-layer states into one value (copied): ``AttentionState`` (S [H, F, d_v],
        z [H, F]), or mappings of names to arrays holding ``S`` (and ``z``, and any others)."""
        if len(layers) == 0:
            msg = "layers: expected at least one AttentionState, received none"
            raise ValueError(msg)
        named = [_named(layer) for layer in layers]
        first = named[0]
        if "S" not in first:
            msg = f"layers[0]: expected a tensor named S, received {sorted(first)}"
            raise ValueError(msg)
        dt = _check_dtype(first["S"].dtype if dtype is None else dtype, "layers")
        for i, layer in enumerate(named):
            if {n: a.shape for n, a in layer.items()} != {n: a.shape for n, a in first.items()}:
                if isinstance(layers[i], AttentionState):
                    msg = (
                        f"layers[{i}]: expected S {list(first['S'].shape)} and z "
                        f"{list(first['z'].shape)} like layer 0, received S "
                        f"{list(layer['S'].shape)} and z {list(layer['z'].shape)}"
                    )
                else:
                    msg = f"layers[{i}]: expected {_shapes(first)} like layer 0, received " + (
                        _shapes(layer)
                    )
                raise ValueError(msg)
            if dtype is None and any(a.dtype != dt for a in layer.values()):
                got = " and ".join(f"{n} {a.dtype}" for n, a in layer.items())
                msg = f"layers[{i}]: expected dtype {dt} like layer 0, received {got}"
                raise TypeError(msg)
        stacked = {}
        for name in first:
            a = np.stack([np.asarray(layer[name], dtype=dt) for layer in named])
            a.setflags(write=False)
            stacked[name] = a
        S, z = stacked.pop("S"), stacked.pop("z", None)
        return cls(seq_id, position, next_chunk, S, z, fingerprint, stacked)

    @classmethod
    def initial(
        cls,
        seq_id: str,
        state_shape: Sequence[int] | Layout,
        fingerprint: str,
        dtype: npt.DTypeLike = np.float64,
    ) -> SequenceState:
        """The zero state of a new sequence; ``state_shape`` is ``(L, H, F, d_v)`` (S and z),
        or a layout: ``(name, shape)`` pairs (see ``layout.check_layout``)."""
        dt = _check_dtype(dtype, "dtype")
        if len(state_shape) and all(isinstance(p, tuple | list) for p in state_shape):
            layout = check_layout(state_shape)
            zeros = {n: np.zeros(s, dtype=dt) for n, s in layout}
            for a in zeros.values():
                a.setflags(write=False)
            S, z = zeros.pop("S"), zeros.pop("z", None)
            return cls(seq_id, 0, 0, S, z, fingerprint, zeros)
        shape = tuple(int(n) for n in state_shape)  # type: ignore[arg-type]
        if len(shape) != 4:
            msg = f"state_shape: expected (L, H, F, d_v), received {tuple(state_shape)}"
            raise ValueError(msg)
        S = np.zeros(shape, dtype=dt)
        z_arr = np.zeros(shape[:3], dtype=dt)
        S.setflags(write=False)
        z_arr.setflags(write=False)
        return cls(seq_id, 0, 0, S, z_arr, fingerprint)

    def advanced(
        self,
        layers: Sequence[AttentionState] | Sequence[Mapping[str, np.ndarray]],
        *,
        tokens: int,
        chunks: int = 1,
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
        """S's shape: ``(L, H, F, d_v)``."""
        L, H, F, dv = self.S.shape
        return (L, H, F, dv)

    @property
    def classic(self) -> bool:
        """Whether the state is S and z alone (checkpoint format 2)."""
        return self.z is not None and not self.extra

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor by name, in order: S, z (if any), then ``extra``."""
        out = {"S": self.S}
        if self.z is not None:
            out["z"] = self.z
        out.update(self.extra)
        return out

    @property
    def layout(self) -> Layout:
        """``(name, shape)`` of every tensor, in order (see ``layout.py``)."""
        return tuple((n, tuple(int(d) for d in a.shape)) for n, a in self.tensors.items())

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.tensors.values())

    def layers(self, *, copy: bool = False) -> list[Any]:
        """Per-layer states: ``AttentionState`` for a classic state, else a dict of names to
        arrays; read-only views, or writable copies with ``copy=True``."""
        n = len(self.S)
        if self.classic:
            assert self.z is not None
            if copy:
                return [AttentionState(self.S[i].copy(), self.z[i].copy()) for i in range(n)]
            return [AttentionState(self.S[i], self.z[i]) for i in range(n)]
        tensors = self.tensors
        return [{k: (a[i].copy() if copy else a[i]) for k, a in tensors.items()} for i in range(n)]

    def is_finite(self) -> bool:
        return all(bool(np.isfinite(a).all()) for a in self.tensors.values())

    def norms(self) -> tuple[float, float]:
        """Frobenius norms over all layers (for display): S's, and z's (a state without z: the
        other tensors')."""
        rest = [a.ravel() for n, a in self.tensors.items() if n != "S"]
        other = float(np.linalg.norm(np.concatenate(rest))) if rest else 0.0
        return float(np.linalg.norm(self.S.ravel())), other

    # --- equality ----------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SequenceState):
            return NotImplemented
        mine, theirs = self.tensors, other.tensors
        return (
            self.seq_id == other.seq_id
            and self.position == other.position
            and self.next_chunk == other.next_chunk
            and self.fingerprint == other.fingerprint
            and self.dtype == other.dtype
            and self.layout == other.layout
            and all(a.tobytes() == theirs[n].tobytes() for n, a in mine.items())
        )

    def __hash__(self) -> int:
        return hash((self.seq_id, self.position, self.next_chunk, self.fingerprint))

    def __repr__(self) -> str:
        shape = (
            list(self.S.shape)
            if self.classic
            else ", ".join(f"{n}{list(s)}" for n, s in self.layout)
        )
        return (
            f"SequenceState(seq_id={self.seq_id!r}, position={self.position}, "
            f"next_chunk={self.next_chunk}, shape={shape}, dtype={self.dtype}, "
            f"fingerprint={self.fingerprint[:12]!r})"
        )


def _named(layer: Any) -> dict[str, np.ndarray]:
    if isinstance(layer, AttentionState):
        return {"S": np.asarray(layer.S), "z": np.asarray(layer.z)}
    if isinstance(layer, Mapping):
        return {str(k): np.asarray(v) for k, v in layer.items()}
    msg = f"layers: expected AttentionState or a mapping of names to arrays, received {layer!r:.60}"
    raise TypeError(msg)


def _shapes(layer: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{n} {list(a.shape)}" for n, a in layer.items())
