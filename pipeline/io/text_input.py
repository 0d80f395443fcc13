"""From files to chunks: text files, JSON Lines, Parquet text rows, token lists and chunk Parquet.

`read_input(pipeline, config)` is the embed job's reader (`config`: an `InputConfig`, the files
and how to read them): it looks at `--input` where the pipeline is built (so a missing input or
an unreadable tokenizer is a usage error, not a failed worker), reads each file on the workers,
tokenizes, cuts every sequence into chunks of `--chunk-tokens` tokens (the last one
`final=True`), and returns `(chunks, dead_letters)`.  A file or a row that cannot be read or
tokenized becomes a dead letter naming the file (and line or row), and the job goes on; under
`--input-format auto` a file whose first 8 KiB are not UTF-8 text (a NUL byte, bytes that are
not UTF-8: an executable, an image) is a `not_text` dead letter, not a sequence of bytes.

`ToChunks` is the same cutting as a PTransform for pipelines of your own: `(seq_id, text)` or
`(seq_id, token ids)` elements, bounded or unbounded, each one whole sequence.

What `--input` names (the files, their format, the tokenizer) is looked at once, where the job
is launched and before Beam is imported, by `plan_input` (input_plan.py); `read_input` takes
that plan, or makes it.  A compressed file (`.gz`, ...) is read decompressed, its sequence id
without the suffix.

Over 400 lines because one plan (`input_plan`: the files, their format, the tokenizer) serves
the reader and the counts made before the run (`input_token_total`, `input_sequence_ids`), and
those share its private helpers (sequence ids from paths, special files); the format sniffing
and the per-stage progress lines live in modules of their own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from linstream.pipeline.elements import Chunk, DeadLetter

from .input_plan import (
    InputPlan,
    detect_format,
    expand_input,
    folder_files,
    plan_input,
    sequence_id,
)
from .read_progress import ReadProgress
from .reader_config import InputConfig
from .special_files import not_a_regular_file, special_file_message
from .text_chunks import cut, sequence_chunks
from .text_sniff import NOT_TEXT, SNIFF_BYTES, not_text_reason
from .tokenizers import TextTokenizer, resolve_tokenizer

__all__ = [
    "DEAD_LETTERS",
    "NOT_TEXT",
    "InputConfig",
    "InputPlan",
    "ToChunks",
    "cut",
    "detect_format",
    "expand_input",
    "folder_files",
    "not_text_reason",
    "plan_input",
    "read_input",
    "read_text_file",
    "sequence_id",
]

DEAD_LETTERS = "dead_letters"
NAMESPACE = "linstream"


def _counter_dead(reason: str) -> None:
    Metrics.counter(NAMESPACE, "dead_letters").inc()
    Metrics.counter(NAMESPACE, f"dead_letters.{reason}").inc()


def _cut_line(c: dict[str, int]) -> str:
    return (
        f"cut {c.get('sequences', 0):,} sequence(s) into {c.get('chunks', 0):,} chunk(s) "
        f"({c.get('tokens', 0):,} tokens)"
    )


def _read_line(c: dict[str, int]) -> str:
    return f"read {c.get('files', 0):,} input file(s), {c.get('bytes', 0):,} bytes"


class _ToChunksFn(beam.DoFn):
    def __init__(self, tokenizer: TextTokenizer, chunk_tokens: int) -> None:
        self.tokenizer, self.chunk_tokens = tokenizer, chunk_tokens
        self._progress: ReadProgress | None = None

    def start_bundle(self) -> None:
        self._progress = ReadProgress(_cut_line)

    def finish_bundle(self) -> None:
        if self._progress is not None:
            self._progress.done()

    def process(self, element: Any) -> Iterator[Any]:
        try:
            seq_id, payload = element
        except (TypeError, ValueError):
            yield _dead(repr(element)[:80], "bad_input_row", "expected (seq_id, text or tokens)")
            return
        chunks = sequence_chunks(str(seq_id), payload, self.tokenizer, self.chunk_tokens)
        if isinstance(chunks, DeadLetter):
            yield _tagged(chunks)
            return
        if self._progress is not None:
            tokens = sum(len(c.data) for c in chunks)
            self._progress.add(sequences=1, chunks=len(chunks), tokens=tokens)
        yield from chunks


def _tagged(dead: DeadLetter) -> beam.pvalue.TaggedOutput:
    """A dead letter on the dead-letter output, counted."""
    _counter_dead(dead.reason)
    return beam.pvalue.TaggedOutput(DEAD_LETTERS, dead)


def _dead(seq_id: str, reason: str, message: str) -> beam.pvalue.TaggedOutput:
    return _tagged(DeadLetter(seq_id, None, reason, message))


class ToChunks(beam.PTransform):
    """`(seq_id, text)` or `(seq_id, token ids)` elements -> `Chunk`s of `chunk_tokens` tokens.

    tokenizer: `builtin:bytes` (default), a tokenizer.json path or URL, or a `TextTokenizer`.
    Each element is one whole sequence; chunk indexes start at 0 and the last chunk is final.
    Bounded or unbounded input alike.  `.with_exception_handling()` returns
    `(chunks, dead_letters)`; without it elements that cannot be tokenized are dropped (and
    counted under `linstream` `dead_letters.<reason>`).
    """

    def __init__(
        self,
        tokenizer: str | TextTokenizer | None = None,
        chunk_tokens: int = 2048,
        *,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            msg = f"chunk_tokens must be an int >= 1, got {chunk_tokens!r}"
            raise ValueError(msg)
        tok = tokenizer if isinstance(tokenizer, TextTokenizer) else resolve_tokenizer(tokenizer)
        if vocab_size is not None:
            tok.check_fits(vocab_size, f"with vocab_size {vocab_size}")
        self.tokenizer, self.chunk_tokens = tok, chunk_tokens
        self._with_errors = False

    def with_exception_handling(self) -> ToChunks:
        other = ToChunks(self.tokenizer, self.chunk_tokens)
        other._with_errors = True
        return other

    def expand(self, pcoll: Any) -> Any:
        out = pcoll | "Cut" >> beam.ParDo(
            _ToChunksFn(self.tokenizer, self.chunk_tokens)
        ).with_outputs(DEAD_LETTERS, main="chunks")
        chunks, dead = out.chunks, out[DEAD_LETTERS]
        chunks.element_type, dead.element_type = Chunk, DeadLetter
        return (chunks, dead) if self._with_errors else chunks


# -- reading files on the workers ---------------------------------------------------------------
class _ReadSequences(beam.DoFn):
    """(root, path) -> (seq_id, text | bytes | tokens) per sequence in the file.

    require_text: a file whose first bytes are not UTF-8 text is a `not_text` dead letter
    (`--input-format auto`); with `--input-format text` every file is read as it is.
    """

    def __init__(
        self, fmt: str, id_column: str, payload_column: str, *, require_text: bool = False
    ) -> None:
        self.fmt, self.id_column, self.payload_column = fmt, id_column, payload_column
        self.require_text = require_text
        self._progress: ReadProgress | None = None

    def start_bundle(self) -> None:
        self._progress = ReadProgress(_read_line)

    def finish_bundle(self) -> None:
        if self._progress is not None:
            self._progress.done()

    def process(self, item: tuple[str, str]) -> Iterator[Any]:
        root, path = item
        Metrics.counter(NAMESPACE, "input_files").inc()
        if self._progress is not None:
            self._progress.add(files=1, bytes=_size_or_zero(path))
        seq_id = sequence_id(root, path)
        if self.fmt == "text":
            for part in read_text_file(seq_id, path, require_text=self.require_text):
                yield _tagged(part) if isinstance(part, DeadLetter) else (seq_id, part)
            return
        kind = not_a_regular_file(path)
        if kind is not None:  # a FIFO would block the open
            yield _dead(seq_id, "unreadable_file", f"{path}: {special_file_message(kind)}")
            return
        try:
            if self.fmt in ("jsonl", "tokens-jsonl"):
                yield from self._json_lines(path)
            else:
                yield from self._parquet_rows(path)
        except Exception as ex:  # any reader error: that file is a dead letter, the job goes on
            yield _dead(seq_id, "unreadable_file", f"{path}: {type(ex).__name__}: {ex}")

    def _json_lines(self, path: str) -> Iterator[Any]:
        with FileSystems.open(path) as fh:
            for line_no, raw in enumerate(iter(fh.readline, b""), 1):
                if not raw.strip():
                    continue
                where = f"{path}:{line_no}"
                try:
                    row = json.loads(raw)
                except (UnicodeDecodeError, json.JSONDecodeError) as ex:
                    yield _dead(where, "bad_input_row", f"{where}: not a JSON object ({ex})")
                    continue
                yield self._row(row, where)

    def _parquet_rows(self, path: str) -> Iterator[Any]:
        import pyarrow.parquet as pq

        with FileSystems.open(path) as fh:
            pf = pq.ParquetFile(fh)
            missing = {self.id_column, self.payload_column} - set(pf.schema_arrow.names)
            if missing:
                msg = (
                    f"expected columns {self.id_column!r} and {self.payload_column!r}, "
                    f"missing {sorted(missing)} (has {pf.schema_arrow.names})"
                )
                raise ValueError(msg)
            row_no = 0
            for batch in pf.iter_batches(columns=[self.id_column, self.payload_column]):
                ids = batch.column(0).to_pylist()
                texts = batch.column(1).to_pylist()
                for seq_id, text in zip(ids, texts, strict=True):
                    row_no += 1
                    yield self._row(
                        {self.id_column: seq_id, self.payload_column: text}, f"{path}#{row_no}"
                    )

    def _row(self, row: Any, where: str) -> Any:
        if not isinstance(row, dict):
            msg = f"{where}: expected a JSON object, got {row!r:.60}"
            return _dead(where, "bad_input_row", msg)
        seq_id, payload = row.get(self.id_column), row.get(self.payload_column)
        if seq_id is None or payload is None:
            msg = (
                f"{where}: expected {self.id_column!r} and {self.payload_column!r}, "
                f"got keys {sorted(row)}"
            )
            return _dead(where, "bad_input_row", msg)
        if self.fmt != "tokens-jsonl" and not isinstance(payload, str):
            msg = f"{where}: {self.payload_column!r} must be a string, got {payload!r:.60}"
            return _dead(str(seq_id), "bad_input_row", msg)
        return (str(seq_id), payload)


def read_text_file(
    seq_id: str, path: str, *, require_text: bool, piece: int | None = None
) -> Iterator[bytes | DeadLetter]:
    """A text file as the embed job reads it (`--input-format text`, or `auto` with
    ``require_text``): its bytes, whole or (``piece``) in pieces of that many bytes, the last
    shorter; or the dead letter saying why it is not read: a FIFO, socket or device
    (`unreadable_file`, never opened), a file whose first 8 KiB are not UTF-8 text (`not_text`,
    with ``require_text``), or an error while reading it (`unreadable_file`, after the pieces
    read before it).  Compressed files (.gz, ...) are read decompressed (Beam's filesystems).
    The embed job's reader and the one-line API read every file through this."""
    kind = not_a_regular_file(path)
    if kind is not None:  # a FIFO would block the open
        msg = f"{path}: {special_file_message(kind)}"
        yield DeadLetter(seq_id, None, "unreadable_file", msg)
        return
    try:
        with FileSystems.open(path) as fh:
            if piece is None:
                data = bytes(fh.read())
                head = data[:SNIFF_BYTES]
            else:
                head = _read_full(fh, max(piece, SNIFF_BYTES))
            why = not_text_reason(head[:SNIFF_BYTES]) if require_text else None
            if why is not None:
                msg = (
                    f"{path}: expected a text file (UTF-8), found {why}; it is not embedded "
                    "(--input-format text embeds any file as its bytes)"
                )
                yield DeadLetter(seq_id, None, NOT_TEXT, msg)
                return
            if piece is None:
                yield data
                return
            buf = head
            while True:
                while len(buf) >= piece:
                    yield buf[:piece]
                    buf = buf[piece:]
                more = _read_full(fh, piece)
                if not more:
                    break
                buf += more
            if buf:
                yield buf
    except Exception as ex:  # any reader error: that file is a dead letter, the job goes on
        msg = f"{path}: {type(ex).__name__}: {ex}"
        yield DeadLetter(seq_id, None, "unreadable_file", msg)


def _read_full(fh: Any, n: int) -> bytes:
    """``n`` bytes of ``fh``, fewer only at its end."""
    parts, got = [], 0
    while got < n:
        part = bytes(fh.read(n - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _size_or_zero(path: str) -> int:
    """A local file's size (for the progress line; 0 where asking would cost a request)."""
    if "://" in path:
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def read_input(pipeline: Any, inputs: InputConfig | InputPlan) -> tuple[Any, Any]:
    """Add the job's reader to `pipeline`: `(chunks, dead_letters)` PCollections.

    ``inputs`` says what to read: an `InputConfig` (the `linstream embed` options input,
    input_format, id_column, text_column, tokens_column, tokenizer, chunk_tokens, model), or
    its `plan_input(config)` when the caller made it already.  Raises UsageError for an input
    that matches nothing, an unreadable tokenizer or one that does not fit the model.
    """
    plan = inputs if isinstance(inputs, InputPlan) else plan_input(inputs)
    config = plan.config
    fmt, files, tokenizer = plan.format, list(plan.files), plan.tokenizer
    if fmt == "chunks":
        from . import ReadChunks

        spec = str(config.input)
        if any("://" not in item and os.path.isdir(item) for item in spec.split(",")):
            spec = ",".join(p for _, p in files if p.endswith(".parquet"))  # a folder's files
        chunks = pipeline | "ReadChunks" >> ReadChunks(spec)
        dead = pipeline | "NoReadDeadLetters" >> beam.Create([]).with_output_types(DeadLetter)
        return chunks, dead
    column = config.tokens_column if fmt == "tokens-jsonl" else None
    column = column or config.text_column
    read = (
        pipeline
        | "InputFiles" >> beam.Create(files)
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadSequences"
        >> beam.ParDo(
            _ReadSequences(
                fmt,
                config.id_column,
                column,
                require_text=(config.input_format or "auto") == "auto",
            )
        ).with_outputs(DEAD_LETTERS, main="sequences")
    )
    chunk_tokens = int(config.chunk_tokens)
    chunks, cut_dead = (
        read.sequences | "ToChunks" >> ToChunks(tokenizer, chunk_tokens).with_exception_handling()
    )
    read_dead = read[DEAD_LETTERS]
    read_dead.element_type = DeadLetter
    dead = (read_dead, cut_dead) | "ReadDeadLetters" >> beam.Flatten()
    return chunks, dead
