"""The Beam writers of the output files: `WriteResults` (Parquet under ``<output>/results/``)
and `WriteDeadLetters` (JSON Lines under ``<output>/dead_letters/``), named per job, window,
pane and shard.  The files' schema and reading them back: output_files.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import fileio
from apache_beam.options.value_provider import StaticValueProvider
from apache_beam.transforms.window import GlobalWindow
from linstream.pipeline.elements import ChunkResult, DeadLetter

from .output_files import (
    DEAD_LETTERS_DIR,
    DEAD_LETTERS_PREFIX,
    RESULTS_DIR,
    RESULTS_PREFIX,
    _join,
    result_schema,
    results_to_table,
)

__all__ = ["WriteDeadLetters", "WriteResults"]


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
    num_shards: files per window (0: one per writer).  compute_dtype: the mode the rows were
    computed in, in each file's schema metadata (`linstream.pipeline.result_metadata`).
    """

    def __init__(
        self,
        output: str,
        width: int,
        emit: str = "tokens",
        num_shards: int = 0,
        *,
        row_group_bytes: int = 8 << 20,
        compute_dtype: str | None = None,
    ) -> None:
        super().__init__()
        self.compute_dtype = compute_dtype
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
                sink=_SinkFactory(result_schema(self.width, self.emit, self.compute_dtype)),
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
