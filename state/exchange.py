"""One sequence's state as a file a user moves: safetensors, checked like untrusted input.

A state file holds every tensor a sequence carries (``S``, ``z`` when the model has one, then
the others: an fla model's convolution tails ...) exactly as carried (its dtype kept), and
metadata (safetensors' string map) that says what it is:

    format          "linstream.state"        format_version  "1"
    fingerprint     the model's fingerprint   seq_id          the sequence it was taken from
    position        tokens consumed           next_chunk      the next chunk index there
    dtype           float64 | float32         layout          [[name, [shape...]], ...] (JSON)

Reading one (`read_state_file`) trusts nothing in it: the file's size is bounded before a byte
is read (by what a state of the expected spec takes, when one is given), the safetensors header
is bounded and parsed as bounded JSON, its format and version are checked, then the model's
fingerprint (a state of another model or architecture names both), the tensors' names, shapes
and dtypes against the expected ``StateSpec``, the metadata against the tensors, and finite
values.  Each refusal is a `StateFileError` (a ValueError) whose one-line message names the
file, what was expected and what was found.  No pickle: safetensors only.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from .layout import Layout, check_layout, layout_from_json, layout_to_json
from .sequence_state import SequenceState
from .store.safe_json import UnsafeJSONError, loads_bounded

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_HEADER_BYTES",
    "StateFileError",
    "StateSpec",
    "read_state_file",
    "state_file_bytes",
    "state_from_bytes",
    "write_state_file",
]

FORMAT = "linstream.state"
FORMAT_VERSION = "1"
#: The largest safetensors header a state file may have (a state's header is a few hundred
#: bytes per tensor; at most ``layout.MAX_TENSORS`` tensors).
MAX_HEADER_BYTES = 64 * 1024
#: The largest state file read when no spec bounds it (`read_state_file` without ``spec``).
MAX_UNBOUNDED_BYTES = 1 << 34

_ST_DTYPES = {"float64": "F64", "float32": "F32"}
_META_KEYS = frozenset(
    (
        "format",
        "format_version",
        "fingerprint",
        "seq_id",
        "position",
        "next_chunk",
        "dtype",
        "layout",
    )
)


class StateFileError(ValueError):
    """A state file refused (or one that cannot be written): the message is one line naming
    the file, what was expected and what it holds."""


@dataclass(frozen=True)
class StateSpec:
    """What a state must be to continue in a job: its tensors (names and shapes, in order),
    dtype and model fingerprint."""

    layout: Layout
    dtype: str
    fingerprint: str

    @classmethod
    def of(cls, st: SequenceState) -> StateSpec:
        """The spec of ``st`` (e.g. a model's zero state: ``step.initial_state``)."""
        return cls(st.layout, str(st.dtype), st.fingerprint)

    @property
    def nbytes(self) -> int:
        size = np.dtype(self.dtype).itemsize
        return sum(math.prod(shape) * size for _name, shape in self.layout)

    def describe(self) -> str:
        return ", ".join(f"{n} {list(s)}" for n, s in self.layout) + f" ({self.dtype})"


def state_file_bytes(st: SequenceState) -> bytes:
    """``st`` as the bytes of a state file."""
    from safetensors.numpy import save

    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "fingerprint": st.fingerprint,
        "seq_id": st.seq_id,
        "position": str(st.position),
        "next_chunk": str(st.next_chunk),
        "dtype": str(st.dtype),
        "layout": layout_to_json(st.layout).decode("ascii"),
    }
    return bytes(save({n: np.ascontiguousarray(a) for n, a in st.tensors.items()}, metadata=meta))


def write_state_file(path: str, st: SequenceState) -> int:
    """Write ``st`` to ``path`` (a local path or fsspec URL), whole or not at all (a local
    file is written beside it and renamed); returns the bytes written."""
    import os

    data = state_file_bytes(st)
    if "://" in path and not path.startswith("file://"):
        import fsspec

        with fsspec.open(path, "wb") as f:
            f.write(data)
        return len(data)
    local = path.removeprefix("file://")
    tmp = f"{local}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, local)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return len(data)


def _bound(spec: StateSpec | None) -> int:
    if spec is None:
        return MAX_UNBOUNDED_BYTES
    return 8 + MAX_HEADER_BYTES + spec.nbytes


def read_state_file(path: str, spec: StateSpec | None = None) -> SequenceState:
    """The state in the file at ``path`` (a local path or fsspec URL), with every check (see
    the module docstring); ``spec``: the state it must be (None: any well-formed state).  The
    value keeps the file's sequence id, position and next chunk."""
    import fsspec

    bound = _bound(spec)
    try:
        fs, where = fsspec.core.url_to_fs(path)
        if fs.isdir(where):
            msg = "expected a state file (.safetensors), found a folder"
            line = f"state file {path}: {msg}"
            raise StateFileError(line)
        size = int(fs.size(where))
        if size > bound:
            what = "" if spec is None else f" (a state {spec.describe()} and its header)"
            msg = f"expected at most {bound:,} bytes{what}, the file has {size:,}"
            line = f"state file {path}: {msg}"
            raise StateFileError(line)
        with fs.open(where, "rb") as f:
            data = f.read(bound + 1)
    except FileNotFoundError:
        line = f"state file {path}: no such file"
        raise StateFileError(line) from None
    except OSError as ex:
        line = f"state file {path}: cannot be read: {ex.strerror or ex}"
        raise StateFileError(line) from None
    if len(data) > bound:  # grew since its size was read
        msg = f"expected at most {bound:,} bytes, the file has more"
        line = f"state file {path}: {msg}"
        raise StateFileError(line)
    return state_from_bytes(data, path, spec)


def _header(data: bytes, path: str) -> tuple[dict[str, object], dict[str, str]]:
    """The safetensors header (bounded) and its metadata."""
    not_st = f"state file {path}: expected a safetensors file"
    if len(data) < 8:
        msg = f"{not_st}, the file has {len(data)} bytes"
        raise StateFileError(msg)
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES:
        msg = (
            f"{not_st} with a header of at most {MAX_HEADER_BYTES:,} bytes, the file declares {n:,}"
        )
        raise StateFileError(msg)
    if 8 + n > len(data):
        msg = (
            f"{not_st}, the file declares a {n:,}-byte header but has {len(data):,} bytes "
            "(truncated, or not safetensors)"
        )
        raise StateFileError(msg)
    try:
        header = loads_bounded(data[8 : 8 + n], max_bytes=MAX_HEADER_BYTES)
    except (UnsafeJSONError, ValueError) as ex:
        msg = f"{not_st}, its header is not JSON ({ex})"
        raise StateFileError(msg) from None
    if not isinstance(header, dict):
        msg = f"{not_st}, its header is not a JSON object"
        raise StateFileError(msg)
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        msg = (
            f"state file {path}: expected linstream state metadata (format={FORMAT}), found "
            "a safetensors file without it"
        )
        raise StateFileError(msg)
    return header, meta


def _int_field(meta: dict[str, str], name: str, path: str) -> int:
    text = meta.get(name, "")
    if not text.isdigit() or len(text) > 19 or int(text) >= 2**63:
        msg = f"state file {path}: expected metadata {name} as a whole number, found {text!r}"
        raise StateFileError(msg)
    return int(text)


def _check_meta(meta: dict[str, str], path: str) -> tuple[Layout, str]:
    if meta.get("format") != FORMAT:
        msg = (
            f"state file {path}: expected metadata format={FORMAT}, found "
            f"{meta.get('format')!r:.60}"
        )
        raise StateFileError(msg)
    if meta.get("format_version") != FORMAT_VERSION:
        msg = (
            f"state file {path}: expected format_version {FORMAT_VERSION}, found "
            f"{meta.get('format_version')!r:.40} (written by a newer linstream?)"
        )
        raise StateFileError(msg)
    missing = sorted(_META_KEYS - set(meta))
    if missing:
        msg = f"state file {path}: expected metadata {', '.join(missing)}"
        raise StateFileError(msg)
    dtype = meta["dtype"]
    if dtype not in _ST_DTYPES:
        msg = f"state file {path}: expected dtype float64 or float32, found {dtype!r:.40}"
        raise StateFileError(msg)
    try:
        layout = layout_from_json(meta["layout"].encode("utf-8"))
        check_layout(layout)
    except ValueError as ex:
        line = (
            f"state file {path}: expected layout metadata [[name, [shape...]], ...] as "
            f"linstream writes it, found one refused ({ex})"
        )
        raise StateFileError(line) from None
    return layout, dtype


def _fingerprint_line(path: str, expected: str, found: str) -> str:
    return (
        f"state file {path}: expected a state of the job's model (fingerprint "
        f"{expected[:16]}…), the file holds a state of another model or architecture "
        f"(fingerprint {found[:16]}…)"
    )


def _check_entries(
    header: dict[str, object], layout: Layout, dtype: str, path: str, n_data: int
) -> None:
    """The header's tensors are the layout's (names, shapes, dtype), within the data."""
    names = [n for n, _ in layout]
    missing = [n for n in names if n not in header]
    extra = sorted(set(header) - set(names))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"extra {', '.join(extra[:8])}"] if extra else []
        )
        msg = (
            f"state file {path}: expected tensors {', '.join(names)}, found "
            f"{', '.join(sorted(header)[:16]) or 'none'} ({'; '.join(parts)})"
        )
        raise StateFileError(msg)
    for name, shape in layout:
        entry = header[name]
        if not isinstance(entry, dict):
            msg = f"state file {path}: tensor {name}: expected a header entry"
            raise StateFileError(msg)
        got_shape, got_dtype = entry.get("shape"), entry.get("dtype")
        if got_dtype != _ST_DTYPES[dtype] or got_shape != list(shape):
            msg = (
                f"state file {path}: tensor {name}: expected {_ST_DTYPES[dtype]} {list(shape)}, "
                f"found {got_dtype!s:.8} {got_shape!s:.80}"
            )
            raise StateFileError(msg)
        offsets = entry.get("data_offsets")
        size = math.prod(shape) * np.dtype(dtype).itemsize
        ok = (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= n_data
            and offsets[1] - offsets[0] == size
        )
        if not ok:
            msg = (
                f"state file {path}: tensor {name}: expected {size:,} bytes within the file's "
                f"{n_data:,} data bytes, found offsets {offsets!s:.60} (truncated or damaged)"
            )
            raise StateFileError(msg)


def state_from_bytes(data: bytes, path: str, spec: StateSpec | None = None) -> SequenceState:
    """The state held by a state file's bytes ``data`` (``path`` names it in messages)."""
    header, meta = _header(data, path)
    layout, dtype = _check_meta(meta, path)
    fingerprint = meta["fingerprint"]
    if spec is not None:
        if fingerprint != spec.fingerprint:
            raise StateFileError(_fingerprint_line(path, spec.fingerprint, fingerprint))
        if dtype != spec.dtype:
            msg = (
                f"state file {path}: expected a {spec.dtype} state (the job's state dtype), "
                f"found {dtype}"
            )
            raise StateFileError(msg)
        if layout != spec.layout:
            got = ", ".join(f"{n} {list(s)}" for n, s in layout)
            msg = f"state file {path}: expected tensors {spec.describe()}, found {got} ({dtype})"
            raise StateFileError(msg)
    n_header = struct.unpack("<Q", data[:8])[0]
    _check_entries(header, layout, dtype, path, len(data) - 8 - n_header)
    from safetensors.numpy import load

    try:
        tensors = load(data)
    except Exception as ex:  # the library's own refusal (SafetensorError and others)
        line = str(ex).splitlines()[0] if str(ex) else type(ex).__name__
        msg = f"state file {path}: not a valid safetensors file: {line}"
        raise StateFileError(msg) from None
    for name, a in tensors.items():
        if not np.isfinite(a).all():
            bad = int(a.size - np.isfinite(a).sum())
            msg = (
                f"state file {path}: tensor {name}: expected finite values, found {bad} NaN or Inf"
            )
            raise StateFileError(msg)
    position = _int_field(meta, "position", path)
    next_chunk = _int_field(meta, "next_chunk", path)
    arrays = {n: tensors[n] for n, _ in layout}
    S, z = arrays.pop("S", None), arrays.pop("z", None)
    if S is None:
        msg = f"state file {path}: expected a tensor named S, found none"
        raise StateFileError(msg)
    try:
        return SequenceState(meta["seq_id"], position, next_chunk, S, z, fingerprint, arrays)
    except (ValueError, TypeError) as ex:
        msg = f"state file {path}: {ex}"
        raise StateFileError(msg) from None
