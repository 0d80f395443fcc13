"""Chunk and result files: Parquet in (one row per chunk), sharded Parquet out, dead letters beside.

Input rows: ``seq_id`` string, ``chunk_index`` int64, ``final`` bool, and either ``tokens``
list<int32> or ``features`` list<fixed_size_list<float32, input_dim>>.
Output rows: ``seq_id``, ``chunk_index``, ``start_position`` int64, and ``embeddings``
list<fixed_size_list<float32, d>> (emit="tokens") or ``embedding`` fixed_size_list<float32, d>
(emit="mean"|"last").  Dead letters go to ``<output>/dead_letters.jsonl`` (one JSON object a line:
seq_id, chunk_index, reason, message).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import fileio, parquetio
from apache_beam.transforms.window import GlobalWindow, GlobalWindows

from .elements import Chunk, ChunkResult, DeadLetter, Unencodable

__all__ = [
    "RESULTS_PREFIX",
    "ReadChunks",
    "WriteDeadLetters",
    "WriteResults",
    "chunk_schema",
    "chunks_to_table",
    "read_dead_letters",
    "read_results",
    "result_schema",
    "table_to_chunks",
]

RESULTS_PREFIX = "results"
DEAD_LETTERS_FILE = "dead_letters.jsonl"


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


def table_to_chunks(table: pa.Table | pa.RecordBatch) -> Iterator[Chunk]:
    """Chunks from a chunk-file table; a malformed row becomes a chunk the stage dead-letters."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    names = set(table.column_names)
    kind = "tokens" if "tokens" in names else "features" if "features" in names else None
    n = table.num_rows
    seq_ids = table.column("seq_id").to_pylist() if "seq_id" in names else [None] * n
    indexes = table.column("chunk_index").to_pylist() if "chunk_index" in names else [None] * n
    finals = table.column("final").to_pylist() if "final" in names else [False] * n
    if kind is None:
        for i in range(n):
            yield Chunk(
                str(seq_ids[i]),
                indexes[i],
                Unencodable(f"a row without a tokens or features column ({sorted(names)})"),
                bool(finals[i]),
            )
        return
    col = table.column(kind).combine_chunks()
    payloads = _list_payloads(col, kind)
    for i in range(n):
        yield Chunk(str(seq_ids[i]), indexes[i], payloads[i], bool(finals[i]))


def _list_payloads(col: pa.Array, kind: str) -> list[Any]:
    """One NumPy array per row of a list column (no per-value Python objects)."""
    if not pa.types.is_list(col.type) and not pa.types.is_large_list(col.type):
        return [Unencodable(f"{kind} column of type {col.type}")] * len(col)
    offsets = col.offsets.to_numpy()
    values = col.values  # children of the whole (unsliced) list
    if kind == "tokens":
        flat = None if values.null_count else values.to_numpy(zero_copy_only=False)
        width = None
    else:
        vt = values.type
        if not pa.types.is_fixed_size_list(vt) or values.null_count or values.values.null_count:
            flat, width = None, None
        else:
            width = vt.list_size
            flat = values.values.to_numpy(zero_copy_only=False)
    out: list[Any] = []
    for i in range(len(col)):
        if not col[i].is_valid:
            out.append(Unencodable(f"a null {kind} value"))
            continue
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        if flat is None:
            row = col[i].as_py()
            out.append(Unencodable(f"{kind} with nulls or an unexpected layout: {row!r:.80}"))
        elif width is None:
            out.append(np.array(flat[lo:hi]))
        else:
            out.append(np.array(flat[lo * width : hi * width]).reshape(hi - lo, width))
    return out


class ReadChunks(beam.PTransform):
    """Read chunk Parquet files (a glob or a comma-separated list of globs) into `Chunk`s."""

    def __init__(self, file_pattern: str) -> None:
        super().__init__()
        self.file_pattern = file_pattern

    def expand(self, pbegin: Any) -> Any:
        patterns = [p for p in self.file_pattern.split(",") if p]
        if len(patterns) == 1:
            tables = pbegin | "ReadParquet" >> parquetio.ReadFromParquetBatched(patterns[0])
        else:
            tables = (
                pbegin
                | "Patterns" >> beam.Create(patterns)
                | "Match" >> fileio.MatchAll()
                | "ReadMatches" >> fileio.ReadMatches()
                | "Path" >> beam.Map(lambda f: f.metadata.path)
                | "ReadParquet" >> parquetio.ReadAllFromParquetBatched()
            )
        return tables | "ToChunks" >> beam.FlatMap(table_to_chunks).with_output_types(Chunk)


def result_schema(width: int, emit: str) -> pa.Schema:
    vec = pa.list_(pa.float32(), width)
    payload = (
        pa.field("embeddings", pa.list_(vec)) if emit == "tokens" else pa.field("embedding", vec)
    )
    return pa.schema(
        [
            pa.field("seq_id", pa.string()),
            pa.field("chunk_index", pa.int64()),
            pa.field("start_position", pa.int64()),
            payload,
        ]
    )


def _result_batch(r: ChunkResult, schema: pa.Schema, width: int, emit: str) -> pa.RecordBatch:
    flat = np.ascontiguousarray(r.output, dtype=np.float32).reshape(-1)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), width)  # no copy
    payload: pa.Array = (
        pa.ListArray.from_arrays(pa.array([0, len(vec)], pa.int32()), vec)
        if emit == "tokens"
        else vec
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.seq_id], pa.string()),
            pa.array([int(r.index)], pa.int64()),
            pa.array([int(r.start_position)], pa.int64()),
            payload,
        ],
        schema=schema,
    )


def results_to_table(results: list[ChunkResult], width: int, emit: str) -> pa.Table:
    """One record batch per result, each viewing the result's array (no concatenation)."""
    schema = result_schema(width, emit)
    return pa.Table.from_batches([_result_batch(r, schema, width, emit) for r in results], schema)


class _ToArrowBatches(beam.DoFn):
    """Group a bundle's results into Arrow tables of up to `rows` chunks each."""

    def __init__(self, width: int, emit: str, rows: int = 64) -> None:
        self.width, self.emit, self.rows = width, emit, rows
        self._buf: list[ChunkResult] = []

    def start_bundle(self) -> None:
        self._buf = []

    def process(self, result: ChunkResult, window: Any = beam.DoFn.WindowParam) -> Any:
        if not isinstance(window, GlobalWindow):
            # Windowed (streaming) input: one table per element keeps each in its own window.
            yield results_to_table([result], self.width, self.emit)
            return
        self._buf.append(result)
        if len(self._buf) >= self.rows:
            yield results_to_table(self._buf, self.width, self.emit)
            self._buf = []

    def finish_bundle(self) -> Any:
        if self._buf:
            yield GlobalWindows.windowed_value(results_to_table(self._buf, self.width, self.emit))
            self._buf = []


class _ParquetTableSink(fileio.FileSink):
    """Writes Arrow tables to one Parquet file; no dictionary encoding (dense float vectors gain
    nothing from it and it costs 4x the write time)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._writer: pq.ParquetWriter | None = None

    def open(self, fh: Any) -> None:
        self._writer = pq.ParquetWriter(fh, self.schema, use_dictionary=False)

    def write(self, record: pa.Table) -> None:
        assert self._writer is not None
        self._writer.write_table(record)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _SinkFactory:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def __call__(self, _destination: Any = None) -> _ParquetTableSink:
        return _ParquetTableSink(self.schema)


class WriteResults(beam.PTransform):
    """Write `ChunkResult`s as sharded Parquet files ``<output>/results-*.parquet``.

    Uses Beam's fileio (temporary files, then an atomic move), so it works in batch and, with
    windowed input, in streaming.  num_shards: files per window (0: one per writer).
    """

    def __init__(self, output: str, width: int, emit: str = "tokens", num_shards: int = 0) -> None:
        super().__init__()
        self.output, self.width, self.emit, self.num_shards = output, width, emit, num_shards

    def expand(self, results: Any) -> Any:
        return (
            results
            | "ToArrow" >> beam.ParDo(_ToArrowBatches(self.width, self.emit))
            | "WriteParquet"
            >> fileio.WriteToFiles(
                path=self.output,
                file_naming=fileio.default_file_naming(RESULTS_PREFIX, ".parquet"),
                sink=_SinkFactory(result_schema(self.width, self.emit)),
                shards=self.num_shards or None,
            )
        )


def _dead_letter_json(d: DeadLetter) -> str:
    return json.dumps(d.as_dict(), sort_keys=True)


class WriteDeadLetters(beam.PTransform):
    """Write `DeadLetter`s to ``<output>/dead_letters.jsonl``, one JSON object a line."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self.output = output

    def expand(self, dead: Any) -> Any:
        return (
            dead
            | "ToJson" >> beam.Map(_dead_letter_json)
            | "WriteJsonLines"
            >> beam.io.WriteToText(
                os.path.join(self.output, DEAD_LETTERS_FILE),
                num_shards=1,
                shard_name_template="",
            )
        )


def read_results(output: str) -> dict[tuple[str, int], tuple[int, np.ndarray]]:
    """{(seq_id, chunk_index): (start_position, output)} from a job's result files (local)."""
    out: dict[tuple[str, int], tuple[int, np.ndarray]] = {}
    for path in _result_files(output):
        table = pq.read_table(path)
        col = "embeddings" if "embeddings" in table.column_names else "embedding"
        arr = table.column(col).combine_chunks()
        if col == "embeddings":
            width = arr.type.value_type.list_size
            offsets = arr.offsets.to_numpy()
            flat = arr.values.values.to_numpy().reshape(-1, width)
            rows = [flat[offsets[i] : offsets[i + 1]] for i in range(len(arr))]
        else:
            width = arr.type.list_size
            rows = list(arr.values.to_numpy().reshape(-1, width))
        seqs = table.column("seq_id").to_pylist()
        idxs = table.column("chunk_index").to_pylist()
        starts = table.column("start_position").to_pylist()
        for s, i, p, r in zip(seqs, idxs, starts, rows, strict=True):
            key = (s, int(i))
            if key in out and not np.array_equal(out[key][1], r):
                msg = f"{output}: chunk {key} appears twice with different outputs"
                raise ValueError(msg)
            out[key] = (int(p), np.array(r))
    return out


def _result_files(output: str) -> list[str]:
    """Result files of a job: under ``<output>/results/`` (hidden names skipped) and the flat
    ``results-*.parquet`` beside it."""
    found = glob.glob(os.path.join(output, f"{RESULTS_PREFIX}-*.parquet"))
    for folder, dirs, files in os.walk(os.path.join(output, RESULTS_PREFIX)):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        found += [os.path.join(folder, f) for f in files if not f.startswith((".", "_"))]
    return sorted(found)


def read_dead_letters(output: str) -> list[dict[str, Any]]:
    path = os.path.join(output, DEAD_LETTERS_FILE)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_chunk_file(path: str, chunks: Iterable[Chunk], input_dim: int | None = None) -> None:
    """Write chunks to one Parquet file (used by `linstream sample` and the tests)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(chunks_to_table(chunks, input_dim), path)
