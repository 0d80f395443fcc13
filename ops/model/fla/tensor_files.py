"""safetensors files read one tensor at a time, upcast once, with bounded memory.

    entries = read_header(path)                    # name -> TensorEntry, checked, nothing read
    with open(path, "rb") as f:
        arr = read_tensor(f, entries[name], np.float32, digests)

Published fla checkpoints store bfloat16, which NumPy has no type for (and safetensors' NumPy
reader refuses): the raw bits are read into a uint16 buffer and widened to float32 by a 16-bit
shift (exact: every bfloat16 is a float32 with the low 16 mantissa bits zero), then to float64 if
asked.  Each tensor is read with one `readinto` into its own buffer; nothing maps the whole file,
so the process holds the converted weights plus at most one tensor's raw bytes.  The header is
untrusted input: its size, JSON, dtypes, shapes and byte ranges are checked before any tensor is
read, and every refusal names the file and the tensor.  Every tensor's raw bytes are hashed as
they are read (the model's weight digest).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

__all__ = ["RAW_DTYPES", "TensorEntry", "TensorFileError", "read_header", "read_tensor"]

_MAX_HEADER = 100 << 20  # a 1.3B model's header is ~50 KB; refuse absurd sizes before parsing
#: safetensors dtype -> (bytes per element, the NumPy type its raw bits are read as)
RAW_DTYPES: dict[str, tuple[int, Any]] = {
    "BF16": (2, np.uint16),
    "F16": (2, np.float16),
    "F32": (4, np.float32),
    "F64": (8, np.float64),
}


class TensorFileError(ValueError):
    """A safetensors file that cannot be read as the runtime needs it."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a file: where its bytes lie (absolute offsets) and what they hold."""

    name: str
    path: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def read_header(
    path: str,
    *,
    size: int | None = None,
    opener: Callable[[str], IO[bytes]] | None = None,
) -> dict[str, TensorEntry]:
    """The checked tensor entries of a safetensors file (reads the header only).  ``size`` and
    ``opener`` (the file's size and how to open it: a remote file's) default to the local
    file's."""
    size = os.path.getsize(path) if size is None else size
    with (opener or _open_local)(path) as f:
        head = f.read(8)
        if len(head) < 8:
            msg = f"{path}: not a safetensors file ({len(head)} bytes)"
            raise TensorFileError(msg)
        n = int.from_bytes(head, "little")
        if n > _MAX_HEADER or 8 + n > size:
            msg = (
                f"{path}: not a safetensors file or truncated (a header of {n} bytes "
                f"announced, a file of {size})"
            )
            raise TensorFileError(msg)
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as ex:
            msg = f"{path}: the safetensors header is not valid JSON ({ex})"
            raise TensorFileError(msg) from ex
    if not isinstance(header, dict):
        msg = f"{path}: the safetensors header must be a JSON object, got {type(header).__name__}"
        raise TensorFileError(msg)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(path, name, info, 8 + n, size)
    return out


def _open_local(path: str) -> IO[bytes]:
    return open(path, "rb")


def _entry(path: str, name: str, info: Any, base: int, size: int) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        msg = f"{where} has a malformed header entry"
        raise TensorFileError(msg)
    dtype = info.get("dtype")
    if dtype not in RAW_DTYPES:
        msg = f"{where} has dtype {dtype}; expected one of {list(RAW_DTYPES)} (float weights)"
        raise TensorFileError(msg)
    shape: Any = info.get("shape")
    offsets: Any = info.get("data_offsets")
    ints = (
        isinstance(shape, list)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape + offsets)
    )
    if not ints:
        msg = f"{where} has a malformed shape {shape!r} or data_offsets {offsets!r}"
        raise TensorFileError(msg)
    begin, end = offsets
    want = int(np.prod(shape, dtype=np.int64)) * RAW_DTYPES[dtype][0]
    if end - begin != want or base + end > size:
        msg = (
            f"{where}: bytes [{begin}, {end}) do not hold a {dtype} tensor of shape {shape} "
            f"({want} bytes) inside the file's {size - base} bytes of data"
        )
        raise TensorFileError(msg)
    return TensorEntry(name, path, dtype, tuple(shape), base + begin, base + end)


def read_tensor(
    f: Any, entry: TensorEntry, dtype: Any, digests: dict[str, str] | None = None
) -> np.ndarray:
    """The tensor as a new array in dtype (float32 or float64), finite, or TensorFileError.

    f: the entry's file, opened in binary mode (read with seek and readinto).  digests: if
    given, receives the sha256 of the tensor's raw bytes under its name."""
    raw_type = RAW_DTYPES[entry.dtype][1]
    raw = np.empty(entry.size, dtype=raw_type)
    view = memoryview(raw.data).cast("B")
    f.seek(entry.start)
    got = 0
    while got < entry.nbytes:
        n = f.readinto(view[got:])
        if not n:
            msg = (
                f"{entry.path}: tensor {entry.name!r} is truncated ({got} of {entry.nbytes} bytes)"
            )
            raise TensorFileError(msg)
        got += n
    if digests is not None:
        digests[entry.name] = hashlib.sha256(view).hexdigest()
    del view
    if entry.dtype == "BF16":
        wide = raw.astype(np.uint32)
        del raw
        wide <<= 16
        arr = wide.view(np.float32)
    else:
        arr = raw
    arr = arr.astype(dtype, copy=False).reshape(entry.shape)
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        msg = (
            f"{entry.path}: tensor {entry.name!r} holds {arr[tuple(bad)]} at index "
            f"{tuple(int(i) for i in bad)}; weights must be finite"
        )
        raise TensorFileError(msg)
    return arr
