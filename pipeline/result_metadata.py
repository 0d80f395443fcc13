"""The file-level metadata of result rows: the compute dtype they were computed in.

A result file (`linstream embed`'s Parquet under ``<output>/results/``, whether Beam's file sink
or the stage's committed spans wrote it) and the one-line API's Tables carry it in their schema
metadata under ``b"linstream.compute_dtype"`` (``float32``, ``float64`` or ``bfloat16``), as the
output folder's record (``compute_dtypes``) does for the whole folder: a reader tells bfloat16
rows from float32 rows with ``pyarrow.parquet.read_schema(path).metadata``.  No Beam and nothing
of the pipeline's own here, so that the writers on both sides of it (io, stage, app) use one
definition.
"""

from __future__ import annotations

from typing import TypeVar

import pyarrow as pa

__all__ = ["COMPUTE_DTYPE_KEY", "compute_dtype_of", "with_compute_dtype"]

#: the schema metadata key of the compute dtype the rows were computed in
COMPUTE_DTYPE_KEY = b"linstream.compute_dtype"

_S = TypeVar("_S", pa.Schema, pa.Table)


def with_compute_dtype(value: _S, compute_dtype: str | None) -> _S:
    """``value`` (a Schema or a Table) with ``compute_dtype`` in its schema metadata (None:
    ``value`` as it is)."""
    if compute_dtype is None:
        return value
    meta = value.schema.metadata if isinstance(value, pa.Table) else value.metadata
    merged = {**(meta or {}), COMPUTE_DTYPE_KEY: str(compute_dtype).encode()}
    if isinstance(value, pa.Table):
        return value.replace_schema_metadata(merged)
    return value.with_metadata(merged)


def compute_dtype_of(schema: pa.Schema) -> str | None:
    """The compute dtype a result file's or Table's ``schema`` records (None: none recorded)."""
    raw = (schema.metadata or {}).get(COMPUTE_DTYPE_KEY)
    return None if raw is None else raw.decode("utf-8", "replace")
