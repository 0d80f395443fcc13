"""Chunk and result files: Parquet in (one row per chunk), sharded Parquet out, dead letters beside.

Input rows: ``seq_id`` string, ``chunk_index`` int64, ``final`` bool, and either ``tokens``
list<int32> or ``features`` list<fixed_size_list<float32, input_dim>>.  A bad row dead-letters
that row alone; a row without a usable seq_id is a ``bad_seq_id`` dead letter; a file that cannot
be read is one ``unreadable_file`` dead letter naming it, and the job goes on (`ReadChunks`).
Output rows: ``seq_id``, ``chunk_index``, ``start_position`` int64, and ``embeddings``
list<fixed_size_list<float32, d>> (emit="tokens") or ``embedding`` fixed_size_list<float32, d>
(emit="mean"|"last"), in Parquet files under ``<output>/results/`` (readable in one call:
``pd.read_parquet("<output>/results")``; nothing else lives there but hidden names).  Dead
letters go to JSON Lines files under ``<output>/dead_letters/`` (one object a line: seq_id,
chunk_index, reason, message).
"""

from __future__ import annotations

import glob
import json
import os
import uuid
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
from apache_beam.options.value_provider import StaticValueProvider
from apache_beam.transforms.window import GlobalWindow

from .elements import Chunk, ChunkResult, DeadLetter, Rejected, Unencodable

__all__ = [
    "DEAD_LETTERS_DIR",
    "RESULTS_DIR",
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

RESULTS_DIR = "results"
RESULTS_PREFIX = "results"
DEAD_LETTERS_DIR = "dead_letters"
DEAD_LETTERS_PREFIX = "dead-letters"


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


class _ReadChunkFile(beam.DoFn):
    """One matched Parquet file -> its chunks; a file that cannot be read -> one `Rejected`
    chunk naming it (reason ``unreadable_file``), and the job goes on."""

    def process(self, readable: Any) -> Iterator[Chunk]:
        path = readable.metadata.path
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
    that cannot be read (not Parquet, truncated or damaged, or without the chunk columns) one
    ``unreadable_file`` dead letter naming the file (rows read before a mid-file error are kept)
    while the other files are read.  These travel as chunks with a `Rejected` payload, which
    `EmbedSequences` and `CausalLinearAttention` send to their dead-letter output before keying
    by sequence.  A pattern that matches no file fails at construction, naming the pattern.
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


def _window_file_naming(prefix: str, suffix: str, job_token: str) -> Any:
    """fileio naming unique per job, window, pane and shard.

    ``<prefix>-<job>-<shard>-of-<n><suffix>`` in the global window (batch), and
    ``<prefix>-<job>-<start>-<end>-p<pane>-<shard>-of-<n><suffix>`` per window (streaming).
    Beam's default naming leaves out the pane (a window that fires twice would overwrite its
    first files) and the job (a second job on one output would overwrite the first's).
    """

    def name(
        window: Any,
        pane: Any,
        shard_index: int | None,
        total_shards: int | None,
        compression: str | None,
        destination: Any,
    ) -> str:
        parts = [prefix, job_token]
        if not isinstance(window, GlobalWindow):
            for ts in (window.start, window.end):
                parts.append(ts.to_utc_datetime().strftime("%Y%m%dT%H%M%S.%fZ"))
            parts.append(f"p{pane.index if pane is not None else 0}")
        if shard_index is not None and total_shards is not None:
            parts.append(f"{int(shard_index):05d}-of-{int(total_shards):05d}")
        ext = f".{compression}" if compression else ""
        return "-".join(parts) + suffix + ext

    return name


def _job_token() -> str:
    return uuid.uuid4().hex[:10]


class _ParquetTableSink(fileio.FileSink):
    """Writes Arrow tables to one Parquet file, each table one row group; no dictionary
    encoding (dense float vectors gain nothing from it and it costs 4x the write time)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._writer: pq.ParquetWriter | None = None

    def open(self, fh: Any) -> None:
        self._writer = pq.ParquetWriter(fh, self.schema, use_dictionary=False)

    def write(self, record: pa.Table) -> None:
        assert self._writer is not None
        self._writer.write_table(record, row_group_size=max(1, record.num_rows))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _SinkFactory:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def __call__(self, _destination: Any = None) -> _ParquetTableSink:
        return _ParquetTableSink(self.schema)


def _output_bytes(result: ChunkResult) -> int:
    return max(1, int(np.asarray(result.output).nbytes))


class WriteResults(beam.PTransform):
    """Write `ChunkResult`s as Parquet files under ``<output>/results/``.

    Results are batched per window (`beam.BatchElements`, by output bytes) so that each row
    group holds about ``row_group_bytes`` of embeddings, then written with Beam's fileio
    (temporary files under ``<output>/.temp-results-<job>``, then a move), in batch and, with
    windowed input, in streaming: file names are unique per job, window, pane and shard.
    num_shards: files per window (0: one per writer).
    """

    def __init__(
        self,
        output: str,
        width: int,
        emit: str = "tokens",
        num_shards: int = 0,
        *,
        row_group_bytes: int = 8 << 20,
    ) -> None:
        super().__init__()
        self.output, self.width, self.emit, self.num_shards = output, width, emit, num_shards
        self.row_group_bytes = int(row_group_bytes)
        self.job_token = _job_token()

    def expand(self, results: Any) -> Any:
        folder = _join(self.output, RESULTS_DIR)
        return (
            results
            | "Batch"
            >> beam.BatchElements(
                min_batch_size=self.row_group_bytes,
                max_batch_size=self.row_group_bytes,
                element_size_fn=_output_bytes,
                record_metrics=False,
            )
            | "ToArrow" >> beam.Map(results_to_table, self.width, self.emit)
            | "WriteParquet"
            >> fileio.WriteToFiles(
                path=folder,
                file_naming=_window_file_naming(RESULTS_PREFIX, ".parquet", self.job_token),
                sink=_SinkFactory(result_schema(self.width, self.emit)),
                shards=self.num_shards or None,
                temp_directory=StaticValueProvider(
                    str, _join(self.output, f".temp-results-{self.job_token}")
                ),
            )
        )


def _dead_letter_json(d: DeadLetter) -> str:
    return json.dumps(d.as_dict(), sort_keys=True)


def _text_sink(_destination: Any = None) -> fileio.TextSink:
    return fileio.TextSink()


class WriteDeadLetters(beam.PTransform):
    """Write `DeadLetter`s as JSON Lines files under ``<output>/dead_letters/`` (one object a
    line: seq_id, chunk_index, reason, message), named per job, window, pane and shard.

    topic: also publish each dead letter to this Pub/Sub topic (`PublishDeadLetters`;
    ``publisher_factory`` replaces the Pub/Sub client, e.g. in tests).
    """

    def __init__(
        self, output: str, *, topic: str | None = None, publisher_factory: Any = None
    ) -> None:
        super().__init__()
        self.output, self.topic, self.publisher_factory = output, topic, publisher_factory
        self.job_token = _job_token()

    def expand(self, dead: Any) -> Any:
        if self.topic:
            from .publish import PublishDeadLetters

            _ = dead | "Publish" >> PublishDeadLetters(self.topic, self.publisher_factory)
        return (
            dead
            | "ToJson" >> beam.Map(_dead_letter_json)
            | "WriteJsonLines"
            >> fileio.WriteToFiles(
                path=_join(self.output, DEAD_LETTERS_DIR),
                file_naming=_window_file_naming(DEAD_LETTERS_PREFIX, ".jsonl", self.job_token),
                sink=_text_sink,
                temp_directory=StaticValueProvider(
                    str, _join(self.output, f".temp-dead-letters-{self.job_token}")
                ),
            )
        )


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if "://" in base else os.path.join(base, name)


def _visible_files(folder: str, legacy: str | None = None) -> tuple[Any, list[str]]:
    """(fsspec filesystem or None for local, sorted file paths under `folder`), leaving out
    hidden names (a path part starting with "." or "_"), as pyarrow.dataset does; plus the
    files matching the glob `legacy` beside `folder` (the flat layout of earlier versions)."""
    if "://" in folder and not folder.startswith("file://"):
        import fsspec

        fs, root = fsspec.core.url_to_fs(folder)
        try:
            found = fs.find(root)
        except FileNotFoundError:
            found = []
        root = root.rstrip("/")
        old = fs.glob(f"{root.rpartition('/')[0]}/{legacy}") if legacy else []
        rel = [(p, p[len(root) :].lstrip("/")) for p in found if p.startswith(root)]
    else:
        fs, root = None, folder.removeprefix("file://")
        rel = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
            for f in filenames:
                path = os.path.join(dirpath, f)
                rel.append((path, os.path.relpath(path, root)))
        old = glob.glob(os.path.join(os.path.dirname(root.rstrip("/")), legacy)) if legacy else []
    visible = [
        p for p, r in rel if r and not any(part.startswith((".", "_")) for part in r.split("/"))
    ]
    return fs, sorted(visible) + sorted(old)


def read_results(output: str) -> dict[tuple[str, int], tuple[int, np.ndarray]]:
    """{(seq_id, chunk_index): (start_position, output)} from the Parquet files under
    ``<output>/results/`` (any depth; and the flat ``results-*.parquet`` of earlier versions),
    on local disk or any fsspec URL."""
    out: dict[tuple[str, int], tuple[int, np.ndarray]] = {}
    fs, paths = _visible_files(_join(output, RESULTS_DIR), f"{RESULTS_PREFIX}-*.parquet")
    for path in paths:
        if fs is None:
            table = pq.read_table(path)
        else:
            with fs.open(path, "rb") as f:
                table = pq.read_table(f)
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


def read_dead_letters(output: str) -> list[dict[str, Any]]:
    """Every dead letter in the JSON Lines files under ``<output>/dead_letters/`` (any depth;
    and the ``dead_letters.jsonl`` of earlier versions), on local disk or any fsspec URL."""
    fs, paths = _visible_files(_join(output, DEAD_LETTERS_DIR), "dead_letters.jsonl")
    out: list[dict[str, Any]] = []
    for path in paths:
        if fs is None:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        else:
            text = fs.cat_file(path).decode("utf-8")
        out.extend(json.loads(line) for line in text.splitlines() if line.strip())
    return out


def write_chunk_file(path: str, chunks: Iterable[Chunk], input_dim: int | None = None) -> None:
    """Write chunks to one Parquet file (used by `linstream sample` and the tests)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(chunks_to_table(chunks, input_dim), path)
