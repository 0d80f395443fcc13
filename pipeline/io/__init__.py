"""Readers and writers: files and streams in, results and dead letters out.

    text_input       `read_input`: text, JSON Lines, Parquet text rows, token lists, chunk files
                     -> chunks; `ToChunks` cuts (id, text or tokens) into chunks
    input_plan       what --input names (files, format, tokenizer), checked before Beam is
                     imported; compressed files and their sequence ids
    reader_config    InputConfig and StreamConfig: what the readers are told, as frozen values
    tokenizers       the built-in byte tokenizer and Hugging Face tokenizer.json files
    chunk_files      the chunk Parquet format and its reader
    special_files    input paths that are not regular files (FIFOs, sockets, devices)
    streaming        unbounded sources for --streaming (Pub/Sub, Kafka): picks and wires them
    stream_messages  stream message formats (JSON, Arrow IPC) -> chunks or dead letters
    kafka_source     Beam's cross-language Kafka read, and the Java-side options it needs
    output_files     the results' schema, reading results and dead letters back, settling them
    output_writers   the Beam writers of results (Parquet) and dead letters (JSON Lines)
    output_record    the output folder's record of its results' schema and model
    read_progress    the readers' progress lines (`linstream -v`)
    text_sniff       what a text file is (UTF-8, no NUL byte in its first 8 KiB)
    publish          dead letters to a Pub/Sub topic

Nothing here imports `linstream.pipeline.stage` or `linstream.pipeline.app`.  The chunk and
result file formats:

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

Names are imported on first use, so that a module needing only the tokenizers does not load
Beam's I/O.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .chunk_files import (
        BAD_SEQ_ID,
        UNREADABLE_FILE,
        ReadChunks,
        chunk_schema,
        chunks_to_table,
        table_to_chunks,
        write_chunk_file,
    )
    from .output_files import (
        DEAD_LETTERS_DIR,
        DEAD_LETTERS_PREFIX,
        RESULTS_DIR,
        RESULTS_PREFIX,
        read_dead_letters,
        read_results,
        result_schema,
        results_to_table,
    )
    from .output_writers import WriteDeadLetters, WriteResults
    from .reader_config import InputConfig, StreamConfig

_WHERE = {
    **dict.fromkeys(
        [
            "BAD_SEQ_ID",
            "UNREADABLE_FILE",
            "ReadChunks",
            "chunk_schema",
            "chunks_to_table",
            "table_to_chunks",
            "write_chunk_file",
        ],
        ".chunk_files",
    ),
    **dict.fromkeys(
        [
            "DEAD_LETTERS_DIR",
            "DEAD_LETTERS_PREFIX",
            "RESULTS_DIR",
            "RESULTS_PREFIX",
            "read_dead_letters",
            "read_results",
            "result_schema",
            "results_to_table",
        ],
        ".output_files",
    ),
    **dict.fromkeys(["WriteDeadLetters", "WriteResults"], ".output_writers"),
    **dict.fromkeys(["InputConfig", "StreamConfig"], ".reader_config"),
}

__all__ = [
    "BAD_SEQ_ID",
    "DEAD_LETTERS_DIR",
    "DEAD_LETTERS_PREFIX",
    "RESULTS_DIR",
    "RESULTS_PREFIX",
    "UNREADABLE_FILE",
    "InputConfig",
    "ReadChunks",
    "StreamConfig",
    "WriteDeadLetters",
    "WriteResults",
    "chunk_schema",
    "chunks_to_table",
    "read_dead_letters",
    "read_results",
    "result_schema",
    "results_to_table",
    "table_to_chunks",
    "write_chunk_file",
]
assert sorted(__all__) == sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
