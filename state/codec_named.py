"""The checkpoint format of a state of named tensors (format 3: any state that is not S and z
alone).

Schema (one row)::

    seq_id: string    position: int64    next_chunk: int64
    tensor.S: arrow.fixed_shape_tensor<float64|float32>[L, H, d_k, d_v]
    tensor.<name>: arrow.fixed_shape_tensor<...>[L, ...]       one per further tensor, in order

Schema metadata: those of format 2 (``codec.py``) with ``linstream.format_version`` 3 and
``linstream.min_reader_version`` 3, plus ``linstream.layout``, the canonical JSON of the
tensors' names and shapes (``layout.py``), which the columns must match exactly.  The digest
(``sha256:<hex>``) covers the scalar fields, the fingerprint, the dtype, the layout and every
tensor's little-endian bytes in layout order.  Format-2 readers refuse these files by their
minimum reader version; the built-in model's states stay format 2, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from .arrow_tensors import (
    SCALARS,
    check_scalar_columns,
    little_endian,
    read_tensor,
    tensor_column,
    tensor_column_shape,
)
from .errors import CorruptCheckpointError
from .layout import Layout, layout_to_json
from .sequence_state import SequenceState

__all__ = [
    "FORMAT_VERSION_NAMED",
    "K_LAYOUT",
    "MIN_READER_VERSION_NAMED",
    "check_named_schema",
    "column_of",
    "named_batch",
    "named_digest",
    "read_named",
]

#: Format of a state of named tensors, and the oldest reader that reads it.
FORMAT_VERSION_NAMED = 3
MIN_READER_VERSION_NAMED = 3
K_LAYOUT = b"linstream.layout"


def column_of(name: str) -> str:
    """The column of tensor ``name``."""
    return f"tensor.{name}"


def named_digest(
    seq_id: str,
    position: int,
    next_chunk: int,
    fingerprint: str,
    dtype: str,
    layout: Layout,
    tensor_bytes: Iterable[Any],
) -> str:
    """``sha256:<hex>`` over the fields, the layout and each tensor's little-endian bytes (in
    layout order)."""
    head = {
        "seq_id": seq_id,
        "position": position,
        "next_chunk": next_chunk,
        "fingerprint": fingerprint,
        "dtype": dtype,
        "layout": [[n, list(s)] for n, s in layout],
    }
    h = hashlib.sha256(b"linstream.state.v3\x00")
    h.update(json.dumps(head, sort_keys=True, ensure_ascii=True).encode("ascii") + b"\x00")
    for data in tensor_bytes:
        h.update(data)
    return "sha256:" + h.hexdigest()


def state_named_digest(st: SequenceState) -> str:
    return named_digest(
        st.seq_id,
        st.position,
        st.next_chunk,
        st.fingerprint,
        str(st.dtype),
        st.layout,
        (np.ascontiguousarray(little_endian(a)).data for a in st.tensors.values()),
    )


def named_batch(st: SequenceState, metadata: dict[bytes, bytes]) -> pa.RecordBatch:
    """The one-row record batch of ``st`` in format 3, its schema carrying ``metadata`` and the
    layout."""
    cols = [(column_of(n), tensor_column(a)) for n, a in st.tensors.items()]
    schema = pa.schema(
        [pa.field(name, typ, nullable=False) for name, typ in SCALARS]
        + [pa.field(name, col.type, nullable=False) for name, col in cols],
        metadata={**metadata, K_LAYOUT: layout_to_json(st.layout)},
    )
    return pa.record_batch(
        [
            pa.array([st.seq_id], pa.string()),
            pa.array([st.position], pa.int64()),
            pa.array([st.next_chunk], pa.int64()),
            *(col for _, col in cols),
        ],
        schema=schema,
    )


def check_named_schema(schema: pa.Schema, dtype: str, layout: Layout) -> None:
    """``CorruptCheckpointError`` unless the columns are the scalars and one tensor column per
    layout entry, in order, each of the layout's shape and the state dtype."""
    want = [n for n, _ in SCALARS] + [column_of(n) for n, _ in layout]
    if list(schema.names) != want:
        msg = f"schema: expected columns {want} (the layout), received {list(schema.names)}"
        raise CorruptCheckpointError(msg)
    check_scalar_columns(schema)
    for name, shape in layout:
        col = column_of(name)
        found = tensor_column_shape(schema, col, dtype)
        if found != shape:
            msg = (
                f"shapes: expected column {col} of shape {list(shape)} (the layout), "
                f"received {list(found)}"
            )
            raise CorruptCheckpointError(msg)


def read_named(batch: pa.RecordBatch, layout: Layout, dtype: str) -> dict[str, np.ndarray]:
    """Every tensor of a format-3 batch (schema checked) as read-only views, by name."""
    return {n: read_tensor(batch, column_of(n), shape, dtype) for n, shape in layout}
