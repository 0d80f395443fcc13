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

Over 400 lines because one plan (`input_plan`: the files, their format, the tokenizer) serves
the reader and the counts made before the run (`input_token_total`, `input_sequence_ids`), and
those share its private helpers (sequence ids from paths, special files); the format sniffing
and the per-stage progress lines live in modules of their own.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from linstream.pipeline.elements import Chunk, DeadLetter
from linstream.pipeline.errors import UsageError

from .read_progress import ReadProgress
from .reader_config import InputConfig
from .special_files import not_a_regular_file, special_file_message
from .text_chunks import cut, sequence_chunks
from .text_sniff import NOT_TEXT, SNIFF_BYTES, not_text_reason
from .tokenizers import TextTokenizer, TokenizerError, resolve_tokenizer

__all__ = [
    "DEAD_LETTERS",
    "NOT_TEXT",
    "InputConfig",
    "ToChunks",
    "cut",
    "detect_format",
    "expand_input",
    "folder_files",
    "input_plan",
    "input_sequence_ids",
    "input_token_total",
    "not_text_reason",
    "read_input",
    "read_text_file",
    "sequence_id",
]

DEAD_LETTERS = "dead_letters"
NAMESPACE = "linstream"
_GLOB = set("*?[")
_TEXT_SUFFIXES = (".jsonl", ".ndjson", ".json")


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


def sequence_id(root: str, path: str) -> str:
    """The sequence id of a file the input names: its path relative to ``root`` (the folder,
    or the folder of the file or glob, that `--input` names), with "/" separators."""
    if "://" in path or "://" in root:
        rel = posixpath.relpath(path, root) if path.startswith(root) else path
        return rel.replace(os.sep, "/")
    return os.path.relpath(path, root).replace(os.sep, "/")


# -- what --input names, where the pipeline is built -------------------------------------------
def _root_of(pattern: str) -> str:
    """The folder part of a pattern before its first glob character."""
    head = pattern
    for i, ch in enumerate(pattern):
        if ch in _GLOB:
            head = pattern[:i]
            break
    return head if head.endswith(("/", os.sep)) else (posixpath.dirname(head) or ".")


def folder_files(folder: str) -> list[str]:
    """Every file below a local folder, hidden names (and what is below them) skipped, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [os.path.join(dirpath, f) for f in filenames if not f.startswith(".")]
    return sorted(found)


def expand_input(spec: str) -> list[tuple[str, str]]:
    """(root, path) of every file `--input` names: folders (all files below them, hidden ones
    skipped), files, globs, comma-separated.  Raises UsageError when something matches nothing."""
    out: list[tuple[str, str]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if "://" not in item and os.path.isdir(item):
            found = folder_files(item)
            if not found:
                msg = f"--input {item}: the folder has no files"
                raise UsageError(msg)
            out += [(item, p) for p in found]
            continue
        if "://" not in item and not (_GLOB & set(item)) and not os.path.exists(item):
            msg = f"--input {item}: no such file or folder"
            raise UsageError(msg)
        pattern = item + "**" if item.endswith("/") else item
        if not (_GLOB & set(pattern)):
            if not FileSystems.exists(pattern):
                msg = f"--input {item}: no such file or folder"
                raise UsageError(msg)
            out.append((_root_of(pattern), pattern))
            continue
        try:
            metas = FileSystems.match([pattern])[0].metadata_list
        except Exception as ex:  # BeamIOError for an unknown scheme or an unreachable bucket
            msg = f"--input {item}: cannot list it ({ex})"
            raise UsageError(msg) from ex
        if not metas:
            msg = f"--input {item}: no file matches"
            raise UsageError(msg)
        root = _root_of(pattern)
        out += [(root, m.path) for m in sorted(metas, key=lambda m: m.path)]
    if not out:
        msg = "--input is empty"
        raise UsageError(msg)
    return out


def detect_format(paths: list[str], id_column: str, text_column: str, tokens_column: str) -> str:
    """`--input-format auto`: Parquet files by their columns, JSON Lines by their first row,
    anything else as text files.  Only regular files are looked into (a FIFO would block):
    with none, the input is text (and each file a dead letter)."""
    first = next((p for p in paths if not_a_regular_file(p) is None), None)
    if first is None:
        return "text"
    low = first.lower()
    if low.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            with FileSystems.open(first) as fh:
                names = pq.read_schema(fh).names
        except Exception as ex:  # not Parquet, truncated, unreadable
            msg = f"--input {first}: not a readable Parquet file ({ex})"
            raise UsageError(msg) from ex
        if "chunk_index" in names:
            return "chunks"
        if text_column in names:
            return "parquet-text"
        msg = (
            f"--input {first}: a Parquet file with columns {names}; expected chunk rows "
            f"(seq_id, chunk_index, final, tokens) or a {text_column!r} column "
            "(set --text-column / --input-format)"
        )
        raise UsageError(msg)
    if low.endswith(_TEXT_SUFFIXES):
        row = _first_json_row(first)
        if isinstance(row, dict) and text_column in row:
            return "jsonl"
        if isinstance(row, dict) and tokens_column in row:
            return "tokens-jsonl"
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        msg = (
            f"--input {first}: JSON Lines rows with keys {keys}; expected {id_column!r} and "
            f"{text_column!r} (or {tokens_column!r}); set --text-column / --input-format"
        )
        raise UsageError(msg)
    return "text"


def _first_json_row(path: str) -> Any:
    try:
        with FileSystems.open(path) as fh:
            for raw in iter(fh.readline, b""):
                if raw.strip():
                    return json.loads(raw)
    except Exception as ex:  # unreadable or not JSON
        msg = f"--input {path}: not readable as JSON Lines ({ex})"
        raise UsageError(msg) from ex
    return None


def _model_vocab(model: str) -> tuple[int | None, str]:
    """(vocab_size or None for a features model, input kind) of a model spec."""
    from linstream.ops.model.runtime import is_model_folder

    cfg: Any
    if model.startswith("builtin:"):
        from linstream.ops import load_model

        cfg = load_model(model).config
    elif is_model_folder(model):
        from linstream.ops.model.fla.folder import read_folder_config

        cfg = read_folder_config(model)  # config.json only: no weights read here
    else:
        from linstream.ops.model.weights import read_model_header

        with FileSystems.open(model) as fh:
            head = bytes(fh.read(8))
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            cfg, _ = read_model_header(head + bytes(fh.read(min(n, 100_000_000))), name=model)
    return (cfg.vocab_size if cfg.input_kind == "tokens" else None), cfg.input_kind


def input_plan(config: InputConfig) -> tuple[str, list[tuple[str, str]], TextTokenizer | None]:
    """(format, files, tokenizer) of ``config.input``, checked against the model."""
    spec = config.input
    if not spec:
        msg = "--input is required (a folder of text files, a file or a glob), or --streaming"
        raise UsageError(msg)
    files = expand_input(str(spec))
    fmt = config.input_format or "auto"
    if fmt == "auto":
        fmt = detect_format(
            [p for _, p in files], config.id_column, config.text_column, config.tokens_column
        )
    if fmt == "chunks":
        return fmt, files, None
    model = str(config.model)
    vocab, kind = _model_vocab(model)
    if vocab is None:
        msg = f"--input-format {fmt} gives token ids, but model {model} reads {kind} vectors"
        raise UsageError(msg)
    tokenizer = None
    if fmt != "tokens-jsonl":
        try:
            tokenizer = resolve_tokenizer(config.tokenizer, model)
            tokenizer.check_fits(vocab, model)
        except TokenizerError as ex:
            raise UsageError(str(ex)) from ex
    return fmt, files, tokenizer


def read_input(pipeline: Any, config: InputConfig) -> tuple[Any, Any]:
    """Add the job's reader to `pipeline`: `(chunks, dead_letters)` PCollections.

    ``config`` says what to read (`InputConfig`: the `linstream embed` options input,
    input_format, id_column, text_column, tokens_column, tokenizer, chunk_tokens, model).
    Raises UsageError for an input that matches nothing, an unreadable tokenizer or one that
    does not fit the model.
    """
    fmt, files, tokenizer = input_plan(config)
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


def input_sequence_ids(config: InputConfig, max_files: int = 1000) -> set[str] | None:
    """The ids of the sequences the input holds, found cheaply before the run (text files: their
    paths; chunk Parquet: the `seq_id` column alone), or None when that would mean reading the
    data (other formats, more than `max_files` files, an unreadable file)."""
    try:
        fmt, files, _tokenizer = input_plan(config)
    except UsageError:
        return None
    if len(files) > max_files:
        return None
    if fmt == "text":
        return {sequence_id(root, path) for root, path in files}
    if fmt != "chunks":
        return None
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for _, path in files:
        if not_a_regular_file(path) is not None:
            continue
        try:
            with FileSystems.open(path) as fh:
                column = pq.read_table(fh, columns=["seq_id"]).column("seq_id")
        except Exception:  # unreadable, or no seq_id column: the reader dead-letters it
            return None
        ids.update(str(v) for v in column.unique().to_pylist() if v is not None)
    return ids


def input_token_total(config: InputConfig, max_files: int = 1000) -> int | None:
    """Tokens the input holds, counted cheaply before the run (Parquet footers; file sizes for
    text read by `builtin:bytes`), or None when that would mean reading the data."""
    try:
        fmt, files, tokenizer = input_plan(config)
    except UsageError:
        return None
    if len(files) > max_files:
        return None
    if fmt == "text" and tokenizer is not None and tokenizer.is_bytes:
        metas = FileSystems.match([p for _, p in files])
        return sum(m.metadata_list[0].size_in_bytes for m in metas if m.metadata_list)
    if fmt != "chunks":
        return None
    import pyarrow.parquet as pq

    total = 0
    for _, path in files:
        if not_a_regular_file(path) is not None:  # never opened: the reader dead-letters it
            continue
        try:
            with FileSystems.open(path) as fh:
                meta = pq.ParquetFile(fh).metadata
        except Exception:  # unreadable: the reader dead-letters or fails it; no total
            return None
        cols = [meta.schema.column(i).path for i in range(meta.num_columns)]
        leaf = next((i for i, c in enumerate(cols) if c.startswith("tokens.")), None)
        if leaf is None:
            return None
        total += sum(meta.row_group(g).column(leaf).num_values for g in range(meta.num_row_groups))
    return total
