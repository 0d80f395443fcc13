"""Tensors in Arrow state files: one fixed-shape tensor column per tensor, one row, little-endian,
written and read back as zero-copy views (the helpers both checkpoint formats share)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from .errors import CorruptCheckpointError

__all__ = [
    "ARROW_TYPES",
    "DTYPES",
    "SCALARS",
    "check_scalar_columns",
    "little_endian",
    "read_tensor",
    "tensor_column",
    "tensor_column_shape",
]

DTYPES: dict[str, np.dtype] = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32)}
ARROW_TYPES = {"float64": pa.float64(), "float32": pa.float32()}
#: The scalar columns every state file starts with.
SCALARS = (("seq_id", pa.string()), ("position", pa.int64()), ("next_chunk", pa.int64()))


def check_scalar_columns(schema: pa.Schema) -> None:
    """``CorruptCheckpointError`` unless the scalar columns have their types."""
    for name, typ in SCALARS:
        if schema.field(name).type != typ:
            msg = f"column {name}: expected {typ}, received {schema.field(name).type}"
            raise CorruptCheckpointError(msg)


def tensor_column_shape(schema: pa.Schema, col: str, dtype: str) -> tuple[int, ...]:
    """The shape of tensor column ``col``: ``CorruptCheckpointError`` unless it is an
    ``arrow.fixed_shape_tensor`` of the state dtype without a permutation."""
    typ = schema.field(col).type
    if not isinstance(typ, pa.FixedShapeTensorType):
        msg = f"column {col}: expected arrow.fixed_shape_tensor, received {typ}"
        raise CorruptCheckpointError(msg)
    if typ.value_type != ARROW_TYPES[dtype]:
        msg = f"column {col}: expected values of the state dtype {dtype}, received {typ.value_type}"
        raise CorruptCheckpointError(msg)
    shape = tuple(int(n) for n in typ.shape)
    perm = typ.permutation
    if perm is not None and list(perm) != list(range(len(shape))):
        msg = f"column {col}: expected no permutation, received {list(perm)}"
        raise CorruptCheckpointError(msg)
    return shape


def little_endian(a: np.ndarray) -> np.ndarray:
    """``a`` itself when its bytes are little-endian, else a little-endian copy."""
    if a.dtype.byteorder in "<|" or (a.dtype.byteorder == "=" and np.little_endian):
        return a
    return a.astype(a.dtype.newbyteorder("<"))


def tensor_column(a: np.ndarray) -> pa.ExtensionArray:
    """A one-row ``arrow.fixed_shape_tensor`` column holding ``a``."""
    arr = np.ascontiguousarray(little_endian(a)).reshape((1, *a.shape))
    return pa.FixedShapeTensorArray.from_numpy_ndarray(arr)


def read_tensor(batch: pa.RecordBatch, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The one row of tensor column ``name`` as a read-only view of ``shape`` (its schema was
    checked): ``CorruptCheckpointError`` when its values do not fill the shape."""
    col = batch.column(name)
    storage = col.storage
    n = math.prod(shape)
    values = storage.flatten()
    if storage.null_count or values.null_count or len(values) != n:
        msg = (
            f"column {name}: expected {n} non-null values, received {len(values)} "
            f"({values.null_count} null)"
        )
        raise CorruptCheckpointError(msg)
    if values.type != ARROW_TYPES[dtype]:
        msg = f"column {name}: expected {dtype} values, received {values.type}"
        raise CorruptCheckpointError(msg)
    # A read-only view of the values buffer (pyarrow's to_numpy would import pandas).
    want = DTYPES[dtype].newbyteorder("<")
    data = values.buffers()[1]
    start, end = values.offset * want.itemsize, (values.offset + n) * want.itemsize
    if data is None or data.size < end:
        size = 0 if data is None else data.size
        msg = f"column {name}: expected {end} bytes of values, received a buffer of {size}"
        raise CorruptCheckpointError(msg)
    arr = np.frombuffer(data, dtype=want, count=n, offset=start).reshape(shape)
    arr.setflags(write=False)
    return arr
