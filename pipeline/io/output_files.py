"""Output files: results as Parquet under ``<output>/results/``, dead letters as JSON Lines under
``<output>/dead_letters/``: their schema, reading them back, settling the dead letters.  No
Beam here (its writers are in output_writers.py), so that a launch reads an output folder
before Beam is imported.

Result rows: ``seq_id``, ``chunk_index``, ``start_position`` int64, and ``embeddings``
list<fixed_size_list<float32, d>> (emit="tokens") or ``embedding`` fixed_size_list<float32, d>
(emit="mean"|"last"), readable in one call: ``pd.read_parquet("<output>/results")``; nothing
else lives there but hidden names.  Dead letters: one object a line (seq_id, chunk_index,
reason, message).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from linstream.pipeline.result_metadata import with_compute_dtype

if TYPE_CHECKING:
    from linstream.pipeline.elements import ChunkResult

__all__ = [
    "DEAD_LETTERS_DIR",
    "DEAD_LETTERS_PREFIX",
    "RESULTS_DIR",
    "RESULTS_PREFIX",
    "read_dead_letters",
    "read_results",
    "result_schema",
    "results_to_table",
    "settle_dead_letters",
    "visible_files",
]

RESULTS_DIR = "results"
RESULTS_PREFIX = "results"
DEAD_LETTERS_DIR = "dead_letters"
DEAD_LETTERS_PREFIX = "dead-letters"


def result_schema(width: int, emit: str, compute_dtype: str | None = None) -> pa.Schema:
    """The result files' schema; the compute dtype the rows were computed in, when given, in
    its metadata (`linstream.pipeline.result_metadata`)."""
    vec = pa.list_(pa.float32(), width)
    payload = (
        pa.field("embeddings", pa.list_(vec)) if emit == "tokens" else pa.field("embedding", vec)
    )
    schema = pa.schema(
        [
            pa.field("seq_id", pa.string()),
            pa.field("chunk_index", pa.int64()),
            pa.field("start_position", pa.int64()),
            payload,
        ]
    )
    return with_compute_dtype(schema, compute_dtype)


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


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if "://" in base else os.path.join(base, name)


def visible_files(folder: str, legacy: str | None = None) -> tuple[Any, list[str]]:
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
    fs, paths = visible_files(_join(output, RESULTS_DIR), f"{RESULTS_PREFIX}-*.parquet")
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
    fs, paths = visible_files(_join(output, DEAD_LETTERS_DIR), "dead_letters.jsonl")
    out: list[dict[str, Any]] = []
    for path in paths:
        if fs is None:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        else:
            text = fs.cat_file(path).decode("utf-8")
        out.extend(json.loads(line) for line in text.splitlines() if line.strip())
    return out


def _dead_letter_key(d: dict[str, Any]) -> tuple[str, ...]:
    """What makes a dead letter the same one met again: its sequence, chunk and reason; for one
    that names no sequence (an unreadable file, a row without a usable id) or no chunk (a chunk
    index that is no whole number: 1.5, NaN), its message too, which names the file and row or
    the index that came (three bad indexes of one sequence are three dead letters)."""
    key = (str(d.get("seq_id")), str(d.get("chunk_index")), str(d.get("reason")))
    if d.get("seq_id") and d.get("chunk_index") is not None:
        return key
    return (*key, str(d.get("message")))


def settle_dead_letters(output: str) -> int:
    """Leave one record per (sequence, chunk, reason) in ``<output>/dead_letters/`` (per
    message too for records that name no sequence or no chunk, see `_dead_letter_key`): jobs
    resumed into one output folder each write the dead letters of the chunks they met, so a
    chunk met again (a bad row read by every resume) would be recorded once per job.  When the
    folder holds a record twice, its records are written once each (the first of each key, in
    file order) to one file named by their content, and the other files go.  Returns how many
    doubled records went.

    Run by a job that reaches its end, after its own dead letters are written.  A stop in the
    middle leaves the new file beside some of the old ones; the next job that reaches its end
    settles them again, to the same file."""
    folder = _join(output, DEAD_LETTERS_DIR)
    fs, paths = visible_files(folder)
    seen: set[tuple[str, ...]] = set()
    kept: list[str] = []
    total = 0
    for path in paths:
        if fs is None:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        else:
            text = fs.cat_file(path).decode("utf-8")
        for line in text.splitlines():
            if not line.strip():
                continue
            total += 1
            d = json.loads(line)
            key = _dead_letter_key(d)
            if key not in seen:
                seen.add(key)
                kept.append(line)
    if total == len(kept):
        return 0
    body = ("\n".join(kept) + "\n").encode("utf-8")
    name = f"{DEAD_LETTERS_PREFIX}-settled-{hashlib.sha256(body).hexdigest()[:16]}.jsonl"
    target = _join(folder, name)
    if fs is None:
        tmp = _join(folder, f".settling-{uuid.uuid4().hex}")  # hidden: readers skip it
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)  # whole or absent
    else:
        fs.pipe_file(target, body)  # one object: whole or absent
    for path in paths:
        if path.rstrip("/").rpartition("/")[2] == name:
            continue
        if fs is None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)
    return total - len(kept)
