"""safetensors files read one tensor at a time in their stored dtype: memory-mapped where the
file is local, read into memory where it is a URL (fsspec), checked and hashed either way.

    entries = read_header(path)                    # name -> TensorEntry, checked, nothing read
    arr = map_tensor(entries[name], digests)       # local: a read-only view of the file's pages
    with open(path, "rb") as f:                    # a URL's file (or any seekable one)
        arr = read_tensor(f, entries[name], digests)

A tensor comes back as a NumPy array of its stored dtype (float32, float16, float64, or
bfloat16 as `ml_dtypes.bfloat16`: the raw bits, which NumPy alone has no type for), never
converted: what the runtime holds (mapped as stored, or converted into its compute dtype) is the
weights factory's choice (`dense.Weights`).  A mapped tensor is its own mapping of the file's
byte range (`mmap`, read-only), so the pages it touches count in the process's memory only while
the array (or a view of it) lives: a tensor that is converted and dropped leaves nothing behind.
The header is untrusted input: its size, JSON, dtypes, shapes and byte ranges are checked
before any tensor is read, and every refusal names the file and the tensor.  Every tensor's
stored bytes are hashed (sha256, the model's weight digest) and checked finite as they are
read, a block at a time (no temporary of the tensor's size).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import ml_dtypes
import numpy as np

__all__ = [
    "STORED_DTYPES",
    "TensorEntry",
    "TensorFileError",
    "is_mapped",
    "map_tensor",
    "read_header",
    "read_tensor",
]

_MAX_HEADER = 100 << 20  # a 1.3B model's header is ~50 KB; refuse absurd sizes before parsing
#: safetensors dtype -> the NumPy dtype of its stored values (little-endian, as the format says)
STORED_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}
_BLOCK = 1 << 24  # bytes hashed and checked finite at a time


class TensorFileError(ValueError):
    """A safetensors file that cannot be read as the runtime needs it."""


class _FileMap(mmap.mmap):
    """A mapping of a file's bytes (`map_tensor`'s), told apart from other mappings."""


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
    if dtype not in STORED_DTYPES:
        msg = f"{where} has dtype {dtype}; expected one of {list(STORED_DTYPES)} (float weights)"
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
    want = int(np.prod(shape, dtype=np.int64)) * STORED_DTYPES[dtype].itemsize
    if end - begin != want or base + end > size:
        msg = (
            f"{where}: bytes [{begin}, {end}) do not hold a {dtype} tensor of shape {shape} "
            f"({want} bytes) inside the file's {size - base} bytes of data"
        )
        raise TensorFileError(msg)
    return TensorEntry(name, path, dtype, tuple(shape), base + begin, base + end)


def map_tensor(entry: TensorEntry, digests: dict[str, str] | None = None) -> np.ndarray:
    """The tensor of a local file as a read-only array of its stored dtype over the file's pages
    (its own mapping, released with the array), checked finite, or TensorFileError.  digests:
    if given, receives the sha256 of the tensor's stored bytes under its name."""
    gran = mmap.ALLOCATIONGRANULARITY
    base = entry.start - entry.start % gran
    try:
        with open(entry.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if entry.end > size:
                msg = (
                    f"{entry.path}: tensor {entry.name!r} is truncated (the file has {size} bytes)"
                )
                raise TensorFileError(msg)
            if entry.nbytes == 0:
                return _checked(np.empty(entry.shape, STORED_DTYPES[entry.dtype]), entry, digests)
            mapped = _FileMap(f.fileno(), entry.end - base, offset=base, access=mmap.ACCESS_READ)
    except OSError as ex:
        msg = f"{entry.path}: tensor {entry.name!r} cannot be mapped ({ex})"
        raise TensorFileError(msg) from ex
    arr = np.frombuffer(
        mapped, STORED_DTYPES[entry.dtype], count=entry.size, offset=entry.start - base
    ).reshape(entry.shape)
    return _checked(arr, entry, digests)


def is_mapped(arr: np.ndarray) -> bool:
    """Whether arr (or the array it views) lies in a file's mapping (`map_tensor`)."""
    base: Any = arr
    while base is not None:
        if isinstance(base, _FileMap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def read_tensor(f: Any, entry: TensorEntry, digests: dict[str, str] | None = None) -> np.ndarray:
    """The tensor as a new array of its stored dtype, checked finite, or TensorFileError.

    f: the entry's file, opened in binary mode (read with seek and readinto).  digests: if
    given, receives the sha256 of the tensor's stored bytes under its name."""
    arr = np.empty(entry.shape, STORED_DTYPES[entry.dtype])
    view = memoryview(arr.reshape(-1).view(np.uint8).data)
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
    del view
    return _checked(arr, entry, digests)


def _checked(arr: np.ndarray, entry: TensorEntry, digests: dict[str, str] | None) -> np.ndarray:
    """arr, its bytes hashed into digests and its values checked finite, a block at a time."""
    flat = arr.reshape(-1)
    h = hashlib.sha256()
    step = max(1, _BLOCK // max(1, arr.itemsize))
    for i in range(0, flat.size, step):
        block = flat[i : i + step]
        h.update(block.view(np.uint8).data)
        ok = np.isfinite(block)
        if not ok.all():
            j = i + int(np.argmin(ok))
            bad = np.unravel_index(j, arr.shape)
            msg = (
                f"{entry.path}: tensor {entry.name!r} holds {float(flat[j])} at index "
                f"{tuple(int(b) for b in bad)}; weights must be finite"
            )
            raise TensorFileError(msg)
    if digests is not None:
        digests[entry.name] = h.hexdigest()
    return arr
