"""Output rows as Arrow tables: building them from results, their Parquet bytes, and the digest
that identifies a sequence's rows wherever they are stored.

One row per chunk: ``seq_id``, ``chunk_index``, ``start_position`` and ``embeddings`` (one
float32 vector per token) or ``embedding`` (one per chunk).  `RowsDigest` hashes rows in chunk
order, row by row, from their values (never from file bytes): the rows of a span hash the same
whether they are read from one pending file, from several, or from a published file that holds
other sequences' rows too, and a commit records the digest of the rows it covers.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

if TYPE_CHECKING:  # Beam is not imported here: `linstream checkpoint verify` reads names only
    from linstream.pipeline.values import ChunkResult

__all__ = [
    "RowsDigest",
    "concat",
    "parquet_bytes",
    "read_parquet_bytes",
    "rows_of",
    "spans_table",
    "without_rows",
]

_ROW = struct.Struct("<IqqqI")  # seq_id bytes, chunk index, start position, vectors, width


def spans_table(
    results: Sequence[ChunkResult], *, per_token: bool, width: int | None = None
) -> pa.Table:
    """One row per chunk: seq_id, chunk_index, start_position and ``embeddings`` (one vector
    per token) or ``embedding`` (one vector per chunk), float32.  ``results`` may be any values
    with a ChunkResult's four attributes; ``width`` defaults to the first one's (and must be
    given for none)."""
    if width is None:
        first = results[0].output
        width = int(np.prod(first.shape[1:])) if per_token else int(np.prod(first.shape))
    flat = (
        np.concatenate([np.asarray(r.output, np.float32).reshape(-1) for r in results])
        if results
        else np.zeros(0, np.float32)
    )
    vec = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), width)
    if per_token:
        lengths = np.array([len(r.output) for r in results], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        payload: pa.Array = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), vec)
        name = "embeddings"
    else:
        payload, name = vec, "embedding"
    return pa.table(
        {
            "seq_id": pa.array([r.seq_id for r in results], pa.string()),
            "chunk_index": pa.array([int(r.index) for r in results], pa.int64()),
            "start_position": pa.array([int(r.start_position) for r in results], pa.int64()),
            name: payload,
        }
    )


def parquet_bytes(table: pa.Table) -> Any:
    """The table as one Parquet file (a pyarrow Buffer); no dictionary encoding (dense float
    vectors gain nothing from it)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, use_dictionary=False)
    return sink.getvalue()


def read_parquet_bytes(data: bytes) -> pa.Table:
    """A Parquet file's table; `ValueError` when the bytes are not a readable Parquet file of
    result rows."""
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as ex:
        msg = f"not a readable Parquet file: {ex}"
        raise ValueError(msg) from ex
    names = set(table.column_names)
    if not {"seq_id", "chunk_index", "start_position"} <= names or not names & {
        "embedding",
        "embeddings",
    }:
        msg = f"not a file of result rows (columns {sorted(names)})"
        raise ValueError(msg)
    return table


def concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def rows_of(table: pa.Table, seq_id: str, first: int, end: int) -> pa.Table:
    """The rows of ``seq_id`` for chunks ``first .. end - 1``, in chunk order."""
    idx = table.column("chunk_index")
    mask = pc.and_(
        pc.equal(table.column("seq_id"), seq_id),
        pc.and_(pc.greater_equal(idx, first), pc.less(idx, end)),
    )
    rows = table.filter(mask)
    return rows.take(pc.sort_indices(rows.column("chunk_index")))


def without_rows(table: pa.Table, seq_id: str, first: int, end: int) -> pa.Table:
    """``table`` without the rows of ``seq_id`` for chunks ``first .. end - 1``."""
    idx = table.column("chunk_index")
    mask = pc.and_(
        pc.equal(table.column("seq_id"), seq_id),
        pc.and_(pc.greater_equal(idx, first), pc.less(idx, end)),
    )
    return table.filter(pc.invert(mask))


def _vectors(table: pa.Table) -> tuple[np.ndarray, np.ndarray, int]:
    """(offsets of each row's vectors, all vectors' float32 values flat, width)."""
    per_token = "embeddings" in table.column_names
    col = table.column("embeddings" if per_token else "embedding").combine_chunks()
    if per_token:
        lengths = col.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
        col = col.flatten()
    else:
        lengths = np.ones(len(col), np.int64)
    width = int(col.type.list_size)
    values = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return offsets, values, width


class RowsDigest:
    """SHA-256 over rows in the order they are added (each row: its sequence id, chunk index,
    start position, vector count and width, then its float32 values); `copy` and `hexdigest`
    as hashlib's, so that a sequence's running digest can be extended commit by commit."""

    def __init__(self, h: Any = None) -> None:
        self._h = h if h is not None else hashlib.sha256(b"linstream.rows.v1\x00")

    def add(self, table: pa.Table) -> RowsDigest:
        """Hash ``table``'s rows, in its order (callers sort by chunk)."""
        if table.num_rows == 0:
            return self
        offsets, values, width = _vectors(table)
        seqs = table.column("seq_id").to_pylist()
        idxs = table.column("chunk_index").to_numpy()
        starts = table.column("start_position").to_numpy()
        h = self._h
        for i, s in enumerate(seqs):
            raw = s.encode("utf-8")
            n = int(offsets[i + 1] - offsets[i])
            lo = int(offsets[i]) * width
            h.update(_ROW.pack(len(raw), int(idxs[i]), int(starts[i]), n, width))
            h.update(raw)
            h.update(values[lo : lo + n * width].tobytes())
        return self

    def copy(self) -> RowsDigest:
        return RowsDigest(self._h.copy())

    def hexdigest(self) -> str:
        return str(self._h.hexdigest())
