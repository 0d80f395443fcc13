"""Chunk files: the Parquet input format (one row per chunk) and its Beam reader.

Rows: ``seq_id`` string, ``chunk_index`` int64, ``final`` bool, and either ``tokens``
list<int32> or ``features`` list<fixed_size_list<float32, input_dim>>.  A bad row dead-letters
that row alone; a row without a usable seq_id is a ``bad_seq_id`` dead letter; a file that cannot
be read is one ``unreadable_file`` dead letter naming it, and the job goes on (`ReadChunks`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from linstream.pipeline.elements import Chunk, Rejected, Unencodable

from .read_progress import ReadProgress
from .special_files import not_a_regular_file, special_file_message

__all__ = [
    "BAD_SEQ_ID",
    "UNREADABLE_FILE",
    "ReadChunks",
    "chunk_schema",
    "chunks_to_table",
    "table_to_chunks",
    "write_chunk_file",
]


def chunk_schema(input_dim: int | None = None) -> pa.Schema:
    """Schema of chunk files: token ids when input_dim is None, else feature vectors."""
    payload = (
        pa.field("tokens", pa.list_(pa.int32()))
        if input_dim is None
        else pa.field("features", pa.list_(pa.list_(pa.float32(), input_dim)))
    )
    return pa.schema(
        [
            pa.field("seq_id", pa.string(), nullable=False),
            pa.field("chunk_index", pa.int64(), nullable=False),
            pa.field("final", pa.bool_(), nullable=False),
            payload,
        ]
    )


def chunks_to_table(chunks: Iterable[Chunk], input_dim: int | None = None) -> pa.Table:
    """Arrow table of chunks (token ids [T] or features [T, input_dim] as their data)."""
    chunks = list(chunks)
    schema = chunk_schema(input_dim)
    lengths = np.array([len(c.data) for c in chunks], dtype=np.int64)
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if input_dim is None:
        flat = (
            np.concatenate([np.asarray(c.data, dtype=np.int32) for c in chunks])
            if chunks
            else np.zeros(0, np.int32)
        )
        values: pa.Array = pa.array(flat, pa.int32())
    else:
        flat = (
            np.concatenate([np.asarray(c.data, dtype=np.float32).reshape(-1) for c in chunks])
            if chunks
            else np.zeros(0, np.float32)
        )
        values = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), input_dim)
    payload = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    return pa.table(
        [
            pa.array([c.seq_id for c in chunks], pa.string()),
            pa.array([int(c.index) for c in chunks], pa.int64()),
            pa.array([bool(c.final) for c in chunks], pa.bool_()),
            payload,
        ],
        schema=schema,
    )


def table_to_chunks(table: pa.Table | pa.RecordBatch, source: str | None = None) -> Iterator[Chunk]:
    """Chunks from a chunk-file table, one per row; a bad row costs only itself.

    A row whose payload is malformed (a null token id, a null list, a wrong type) becomes a chunk
    the stage dead-letters (`Unencodable` payload: ``bad_dtype``).  A row without a usable
    ``seq_id`` (null, missing, empty, not a string) becomes a chunk with a `Rejected` payload
    (reason ``bad_seq_id``) and seq_id ``""``: the transforms dead-letter it before keying, so it
    is never applied as a sequence (not as ``"None"``, not as ``"b'...'"``).  ``source`` (a file
    name) is named in those messages.
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    names = set(table.column_names)
    kind = "tokens" if "tokens" in names else "features" if "features" in names else None
    n = table.num_rows
    seq_ids = _seq_ids(table.column("seq_id")) if "seq_id" in names else [None] * n
    indexes = table.column("chunk_index").to_pylist() if "chunk_index" in names else [None] * n
    finals = table.column("final").to_pylist() if "final" in names else [False] * n
    if kind is None:
        payloads: list[Any] = [
            Unencodable(f"a row without a tokens or features column ({sorted(names)})")
        ] * n
    else:
        payloads = _list_payloads(table.column(kind).combine_chunks(), kind)
    where = f"{source}, " if source else ""
    for i in range(n):
        seq_id = seq_ids[i]
        if isinstance(seq_id, str) and seq_id:
            yield Chunk(seq_id, indexes[i], payloads[i], bool(finals[i]))
            continue
        got = "no seq_id column" if "seq_id" not in names else f"{seq_id!r:.80}"
        msg = (
            f"{where}row {i} (chunk_index {indexes[i]!r}): expected a non-empty string seq_id, "
            f"got {got}"
        )
        idx = indexes[i] if isinstance(indexes[i], int) else None
        yield Chunk("", idx, Rejected(BAD_SEQ_ID, msg), bool(finals[i]))


def _seq_ids(col: pa.ChunkedArray) -> list[Any]:
    """Python values of a seq_id column; invalid UTF-8 stays bytes (and is rejected)."""
    try:
        return col.to_pylist()
    except (UnicodeDecodeError, pa.ArrowException):
        raw = col.cast(pa.binary()).to_pylist()
        out: list[Any] = []
        for b in raw:
            try:
                out.append(None if b is None else b.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(b)
        return out


def _row_nulls(mask: pa.Array, offsets: np.ndarray) -> np.ndarray:
    """Per row of a list column: whether any of its values [offsets[i], offsets[i+1]) is null."""
    nulls = np.asarray(mask.to_numpy(zero_copy_only=False), dtype=np.int64)
    counts = np.concatenate([[0], np.cumsum(nulls)])
    return counts[offsets[1:]] > counts[offsets[:-1]]


def _list_payloads(col: pa.Array, kind: str) -> list[Any]:
    """One NumPy array per row of a list column (no per-value Python objects); a row with a null
    value, or that is null, becomes an `Unencodable` naming it (the other rows are unharmed)."""
    if not pa.types.is_list(col.type) and not pa.types.is_large_list(col.type):
        return [Unencodable(f"{kind} column of type {col.type}")] * len(col)
    offsets = col.offsets.to_numpy().astype(np.int64)
    values = col.values  # children of the whole (unsliced) list
    width = None
    if kind == "tokens":
        has_null = _row_nulls(values.is_null(), offsets)
        filled = values
        if values.null_count:
            try:
                filled = pc.fill_null(values, 0)
            except pa.ArrowException:  # a type without a zero (strings): rows stay objects
                filled = values
        flat = filled.to_numpy(zero_copy_only=False)
    else:
        vt = values.type
        if not pa.types.is_fixed_size_list(vt):
            flat = None
        else:
            width = vt.list_size
            # Every element's `width` slots, null elements included (flatten() would drop them).
            inner = values.values.slice(values.offset * width, len(values) * width)
            elem_null = np.asarray(values.is_null().to_numpy(zero_copy_only=False), bool)
            if width:
                inner_null = inner.is_null().to_numpy(zero_copy_only=False)
                elem_null |= inner_null.reshape(-1, width).any(axis=1)
            has_null = _row_nulls(pa.array(elem_null), offsets)
            flat = pc.fill_null(inner, 0).to_numpy(zero_copy_only=False)
    out: list[Any] = []
    for i in range(len(col)):
        if not col[i].is_valid:
            out.append(Unencodable(f"a null {kind} value"))
            continue
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        if flat is None:
            row = col[i].as_py()
            out.append(Unencodable(f"{kind} with an unexpected layout: {row!r:.80}"))
        elif has_null[i]:
            pos = [j for j, v in enumerate(col[i].as_py()) if v is None or _holds_none(v)]
            out.append(
                Unencodable(f"{kind} with a null value at position(s) {pos[:5]} of {hi - lo}")
            )
        elif width is None:
            try:
                out.append(np.array(flat[lo:hi]))
            except ValueError as ex:  # nested values of uneven lengths
                out.append(Unencodable(f"{kind} with an unexpected layout: {ex}"))
        else:
            out.append(np.array(flat[lo * width : hi * width]).reshape(hi - lo, width))
    return out


def _holds_none(v: Any) -> bool:
    return isinstance(v, list) and any(x is None for x in v)


#: Dead-letter reasons given by the reader (before the stateful stage).
BAD_SEQ_ID = "bad_seq_id"
UNREADABLE_FILE = "unreadable_file"
_REQUIRED = ("seq_id", "chunk_index")
_READ_BATCH_ROWS = 256


def _schema_problem(schema: pa.Schema) -> str | None:
    missing = [c for c in _REQUIRED if c not in schema.names]
    if missing or not {"tokens", "features"} & set(schema.names):
        return (
            "expected a chunk file with columns seq_id, chunk_index, final and tokens or "
            f"features, got columns {schema.names}"
        )
    return None


def _file_rejected(path: str, message: str) -> Chunk:
    return Chunk("", None, Rejected(UNREADABLE_FILE, f"file {path}: {message}"))


def _read_line(c: dict[str, int]) -> str:
    return f"read {c.get('files', 0):,} chunk file(s), {c.get('rows', 0):,} chunk row(s)"


class _ReadChunkFile(beam.DoFn):
    """One matched Parquet file -> its chunks; a file that cannot be read -> one `Rejected`
    chunk naming it (reason ``unreadable_file``), and the job goes on."""

    def __init__(self) -> None:
        self._progress: ReadProgress | None = None

    def start_bundle(self) -> None:
        self._progress = ReadProgress(_read_line)

    def finish_bundle(self) -> None:
        if self._progress is not None:
            self._progress.done()

    def process(self, readable: Any) -> Iterator[Chunk]:
        path = readable.metadata.path
        if self._progress is not None:
            self._progress.add(files=1)
        kind = not_a_regular_file(path)
        if kind is not None:  # a FIFO would block the open
            yield _file_rejected(path, special_file_message(kind))
            return
        rows = 0
        try:
            with readable.open(compression_type=CompressionTypes.UNCOMPRESSED) as fh:
                pf = pq.ParquetFile(fh)
                problem = _schema_problem(pf.schema_arrow)
                if problem is not None:
                    yield _file_rejected(path, problem)
                    return
                for batch in pf.iter_batches(batch_size=_READ_BATCH_ROWS):
                    chunks = list(table_to_chunks(batch, source=path))
                    rows += batch.num_rows
                    if self._progress is not None:
                        self._progress.add(rows=batch.num_rows)
                    yield from chunks
        except (pa.ArrowException, OSError, ValueError, TypeError, EOFError) as ex:
            done = f" after its first {rows} rows were read" if rows else ""
            msg = (
                f"cannot be read as a Parquet chunk file{done} "
                f"({type(ex).__name__}: {str(ex)[:200]})"
            )
            yield _file_rejected(path, msg)


class ReadChunks(beam.PTransform):
    """Read chunk Parquet files (a glob or a comma-separated list of globs) into `Chunk`s.

    Bad input costs only itself: a malformed row becomes a chunk the stage dead-letters (see
    `table_to_chunks`), a row without a usable seq_id a ``bad_seq_id`` dead letter, and a file
    that cannot be read (not Parquet, truncated or damaged, without the chunk columns, or not a
    regular file: a FIFO is never opened) one ``unreadable_file`` dead letter naming the file
    (rows read before a mid-file error are kept) while the other files are read. These travel as
    chunks with a `Rejected` payload, which `EmbedSequences` and `CausalLinearAttention` send to
    their dead-letter output before keying by sequence. A pattern that matches no file fails at
    construction, naming the pattern.
    """

    def __init__(self, file_pattern: str) -> None:
        super().__init__()
        self.file_pattern = file_pattern

    def expand(self, pbegin: Any) -> Any:
        patterns = [p for p in self.file_pattern.split(",") if p]
        for pattern in patterns:
            if not FileSystems.match([pattern])[0].metadata_list:
                msg = f"no input file matches {pattern!r}"
                raise FileNotFoundError(msg)
        return (
            pbegin
            | "Patterns" >> beam.Create(patterns)
            | "Match" >> fileio.MatchAll()
            | "ReadMatches" >> fileio.ReadMatches()
            | "Spread" >> beam.Reshuffle()
            | "ReadParquet" >> beam.ParDo(_ReadChunkFile()).with_output_types(Chunk)
        )


def write_chunk_file(path: str, chunks: Iterable[Chunk], input_dim: int | None = None) -> None:
    """Write chunks to one Parquet file (used by `linstream sample` and the tests)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(chunks_to_table(chunks, input_dim), path)
