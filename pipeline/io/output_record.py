"""The output folder's own record: what the results under ``<output>/results/`` are.

A job writes ``<output>/_linstream_output.json`` before it writes any result (one JSON object:
format, emit, width, the results' columns and their Arrow types, the model and its fingerprint,
the compute dtypes its rows were computed in, and the tokens per chunk when linstream cut the
input into chunks), so that a later job on the same folder can tell whether its rows would fit:
one results folder holds one schema, one model's embeddings and one chunking, never a mix that
`pd.read_parquet` would return without a word (two chunkings would give one chunk index two
different spans).  The compute dtypes: one, unless a job resumed its checkpoints in another
mode (`--resume --compute-dtype`; the chunks after the resume are the new mode's), which adds
its own to the list.  The name starts with "_",
so `pyarrow.dataset`, pandas and Spark skip it.

Also here: what an output folder holds (its result and dead-letter files), how many rows result
files hold (from their Parquet footers), and clearing the folder's own parts for
`--output-mode overwrite` (``results/``, ``dead_letters/``, the record; nothing else in it).
Local paths and any fsspec URL (gs://, s3://, memory://).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .output_files import (
    DEAD_LETTERS_DIR,
    RESULTS_DIR,
    RESULTS_PREFIX,
    result_schema,
    visible_files,
)

__all__ = [
    "RECORD_NAME",
    "OutputContents",
    "OutputRecord",
    "clear_output",
    "output_contents",
    "read_record",
    "result_rows",
    "write_record",
]

RECORD_NAME = "_linstream_output.json"
_FORMAT = 1
_MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class OutputRecord:
    """What a job writes into its output folder: the schema of its rows and their model."""

    emit: str
    width: int
    columns: tuple[tuple[str, str], ...]  # (name, Arrow type) of every result column
    model: str = ""  # the model as the job named it
    fingerprint: str = ""  # the model's fingerprint ("" when not known: an older folder)
    #: tokens per chunk when linstream cut the input (None: the input came as chunks, or an
    #: older folder's record, which did not say)
    chunk_tokens: int | None = None
    #: the compute dtypes (`--compute-dtype`: float32, float64, bfloat16) the rows were
    #: computed in, in the order the jobs ran; () in an older folder's record, which did not say
    compute_dtypes: tuple[str, ...] = ()

    @classmethod
    def for_job(
        cls,
        emit: str,
        width: int,
        model: str,
        fingerprint: str,
        chunk_tokens: int | None = None,
        compute_dtype: str | None = None,
    ) -> OutputRecord:
        columns = _columns(result_schema(int(width), emit))
        modes = () if compute_dtype is None else (compute_dtype,)
        return cls(emit, int(width), columns, model, fingerprint, chunk_tokens, modes)

    @classmethod
    def of_schema(cls, schema: pa.Schema) -> OutputRecord:
        """What a result file's own schema says (an output folder without a record)."""
        names = schema.names
        if "embeddings" in names:
            emit, vec = "tokens", schema.field("embeddings").type.value_type
        elif "embedding" in names:
            emit, vec = "mean, last or sequence", schema.field("embedding").type
        else:
            emit, vec = "unknown", None
        width = int(getattr(vec, "list_size", 0) or 0)
        return cls(emit, width, _columns(schema))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "emit": self.emit,
            "width": self.width,
            "columns": [list(c) for c in self.columns],
            "model": self.model,
            "model_fingerprint": self.fingerprint,
            "chunk_tokens": self.chunk_tokens,
            "compute_dtypes": list(self.compute_dtypes),
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> OutputRecord:
        version = obj.get("format") if isinstance(obj, dict) else None
        if isinstance(version, int) and version > _FORMAT:
            msg = f"{where}: written by a newer linstream (record format {version})"
            raise ValueError(msg)
        try:
            chunk = obj.get("chunk_tokens")
            return cls(
                str(obj["emit"]),
                int(obj["width"]),
                tuple((str(n), str(t)) for n, t in obj["columns"]),
                str(obj.get("model", "")),
                str(obj.get("model_fingerprint", "")),
                None if chunk is None else int(chunk),
                tuple(str(m) for m in obj.get("compute_dtypes") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as ex:
            msg = f"{where}: not a linstream output record ({type(ex).__name__}: {ex})"
            raise ValueError(msg) from ex

    def describe(self) -> str:
        """`--emit mean, 64 wide (model builtin:default)`."""
        model = f" (model {self.model})" if self.model else ""
        return f"--emit {self.emit}, {self.width} wide{model}"


def _columns(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, str(f.type)) for f in schema)


def _remote(output: str) -> bool:
    return "://" in output and not output.startswith("file://")


def _fs(output: str) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(output)


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if "://" in base else os.path.join(base, name)


def read_record(output: str) -> OutputRecord | None:
    """The folder's record, or None when it has none; ValueError naming a malformed one."""
    path = _join(output, RECORD_NAME)
    try:
        if _remote(output):
            fs, root = _fs(path)
            with fs.open(root, "rb") as f:
                raw = f.read(_MAX_RECORD_BYTES)
        else:
            with open(path.removeprefix("file://"), "rb") as f:
                raw = f.read(_MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        msg = f"{path}: not a linstream output record ({ex})"
        raise ValueError(msg) from ex
    return OutputRecord.from_json(obj, path)


def write_record(output: str, record: OutputRecord) -> None:
    """Write (or replace) the folder's record; the folder is made if needed."""
    data = (json.dumps(record.to_json(), indent=1, sort_keys=True) + "\n").encode()
    path = _join(output, RECORD_NAME)
    if _remote(output):
        fs, root = _fs(path)
        fs.makedirs(root.rpartition("/")[0], exist_ok=True)
        fs.pipe_file(root, data)
        return
    local = path.removeprefix("file://")
    os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
    tmp = f"{local}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, local)  # a reader never sees half a record


@dataclass(frozen=True)
class OutputContents:
    """The result and dead-letter files an output folder holds (hidden names left out)."""

    result_files: tuple[str, ...]
    dead_letter_files: tuple[str, ...]
    fs: Any = None  # the fsspec filesystem of a URL; None on local disk

    @property
    def empty(self) -> bool:
        return not (self.result_files or self.dead_letter_files)

    def describe(self) -> str:
        """`12 result file(s), 1 dead-letter file(s)`."""
        parts = [f"{len(self.result_files):,} result file(s)"]
        if self.dead_letter_files:
            parts.append(f"{len(self.dead_letter_files):,} dead-letter file(s)")
        return ", ".join(parts)

    def results_schema(self) -> pa.Schema | None:
        """The schema of its first result file (None: no result file)."""
        if not self.result_files:
            return None
        path = self.result_files[0]
        if self.fs is None:
            return pq.read_schema(path)
        with self.fs.open(path, "rb") as f:
            return pq.read_schema(f)


def output_contents(output: str) -> OutputContents:
    """What ``output`` holds under ``results/`` and ``dead_letters/`` (any depth)."""
    fs, results = visible_files(_join(output, RESULTS_DIR), f"{RESULTS_PREFIX}-*.parquet")
    _, dead = visible_files(_join(output, DEAD_LETTERS_DIR), "dead_letters.jsonl")
    return OutputContents(tuple(results), tuple(dead), fs)


def result_rows(contents: OutputContents, paths: list[str] | tuple[str, ...]) -> int:
    """Rows in the result files ``paths`` (their Parquet footers; nothing else is read)."""
    rows = 0
    for path in paths:
        if contents.fs is None:
            rows += pq.read_metadata(path).num_rows
        else:
            with contents.fs.open(path, "rb") as f:
                rows += pq.ParquetFile(f).metadata.num_rows
    return rows


def clear_output(output: str) -> list[str]:
    """Delete the folder's own parts (``results/``, ``dead_letters/``, the record); what else
    the folder holds stays.  Returns what was deleted."""
    names = [RESULTS_DIR, DEAD_LETTERS_DIR, RECORD_NAME]
    removed = []
    if _remote(output):
        fs, root = _fs(output)
        for name in names:
            path = f"{root.rstrip('/')}/{name}"
            if fs.exists(path):
                fs.rm(path, recursive=True)
                removed.append(path)
        return removed
    root = output.removeprefix("file://")
    for name in names:
        path = os.path.join(root, name)
        if os.path.islink(path) or os.path.isfile(path):
            os.remove(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        else:
            continue
        removed.append(path)
    return removed
