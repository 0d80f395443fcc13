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

The chunk format and its reader live in `chunk_files`, the writers of results and dead letters
and their readers in `output_files`; this module gathers both under their old import path.
"""

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
    WriteDeadLetters,
    WriteResults,
    read_dead_letters,
    read_results,
    result_schema,
    results_to_table,
)

__all__ = [
    "BAD_SEQ_ID",
    "DEAD_LETTERS_DIR",
    "DEAD_LETTERS_PREFIX",
    "RESULTS_DIR",
    "RESULTS_PREFIX",
    "UNREADABLE_FILE",
    "ReadChunks",
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
