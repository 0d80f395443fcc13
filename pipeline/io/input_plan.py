"""What `--input` names, looked at where the job is launched, before Beam is imported.

`plan_input(config)` turns an `InputConfig` into an `InputPlan`: every file (folders walked,
hidden names skipped; globs; comma-separated items), their format (`--input-format auto` looks
at the first file) and the tokenizer, checked against the model's vocabulary.  A missing input,
a glob that matches nothing, an unreadable first file, a tokenizer that does not fit: each is a
`UsageError` (exit status 2), found in well under a second for local files.  The plan is made
once per job and handed on: to the reader (`read_input`), and to the counts the progress line
needs (`InputPlan.token_total`, `InputPlan.sequence_ids`).

Local paths are read with the standard library (a glob follows Python's `glob`, hidden names
skipped, `**` any depth of folders); URLs (gs://, s3://, ...) with Beam's filesystems, imported
only for them.  A compressed file (`.gz`, `.bz2`, `.xz`, `.lzma`, `.zst`, `.zstd`, `.deflate`:
the suffixes Beam's readers decompress) is read decompressed, and its sequence id is its path
without that suffix (`notes/a.txt.gz` is the sequence `notes/a.txt`).
"""

from __future__ import annotations

import glob
import json
import os
import posixpath
from dataclasses import dataclass
from typing import Any

from linstream.pipeline.errors import UsageError

from .reader_config import InputConfig
from .special_files import not_a_regular_file
from .tokenizers import TextTokenizer, TokenizerError, resolve_tokenizer

__all__ = [
    "COMPRESSED_SUFFIXES",
    "InputPlan",
    "detect_format",
    "expand_input",
    "folder_files",
    "input_files",
    "missing_model",
    "plan_input",
    "refuse_shared_ids",
    "sequence_id",
]

_GLOB = set("*?[")
_TEXT_SUFFIXES = (".jsonl", ".ndjson", ".json")
#: Suffixes whose files Beam's readers decompress (CompressionTypes.AUTO); the sequence id of
#: such a file leaves the suffix out.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".lzma", ".zst", ".zstd", ".deflate")
#: Beyond this many files, the counts made before the run are not made (they read every file's
#: size or footer).
MAX_COUNTED_FILES = 1000


def _compression(path: str) -> str | None:
    low = path.lower()
    return next((s for s in COMPRESSED_SUFFIXES if low.endswith(s)), None)


def sequence_id(root: str, path: str) -> str:
    """A file's sequence id: its path relative to `root` (with `/`), without a compression
    suffix (`a.txt.gz` is `a.txt`)."""
    if "://" in path or "://" in root:
        rel = posixpath.relpath(path, root) if path.startswith(root) else path
    else:
        rel = os.path.relpath(path, root)
    rel = rel.replace(os.sep, "/")
    suffix = _compression(rel)
    return rel[: -len(suffix)] if suffix and len(rel) > len(suffix) else rel


def _open(path: str) -> Any:
    """A file's bytes, decompressed: a plain local file with `open`, anything else (a URL, a
    compressed file) with Beam's filesystems, which decompress by suffix."""
    if "://" not in path and _compression(path) is None:
        return open(path, "rb")
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(path)


# -- what --input names -------------------------------------------------------------------------
def _root_of(pattern: str) -> str:
    """The folder part of a pattern before its first glob character."""
    head = pattern
    for i, ch in enumerate(pattern):
        if ch in _GLOB:
            head = pattern[:i]
            break
    return head if head.endswith(("/", os.sep)) else (posixpath.dirname(head) or ".")


def _local_glob(pattern: str) -> list[str]:
    return sorted(p for p in glob.glob(pattern, recursive=True) if not os.path.isdir(p))


def _remote_match(item: str, pattern: str) -> list[str]:
    from apache_beam.io.filesystems import FileSystems

    if not (_GLOB & set(pattern)):
        if not FileSystems.exists(pattern):
            msg = f"--input {item}: no such file or folder"
            raise UsageError(msg)
        return [pattern]
    try:
        metas = FileSystems.match([pattern])[0].metadata_list
    except Exception as ex:  # BeamIOError for an unknown scheme or an unreachable bucket
        msg = f"--input {item}: cannot list it ({ex})"
        raise UsageError(msg) from ex
    return sorted(m.path for m in metas)


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
        local = "://" not in item
        path = item
        if local and os.path.isdir(path):
            found = folder_files(path)
            if not found:
                msg = f"--input {item}: the folder has no files"
                raise UsageError(msg)
            out += [(path, p) for p in found]
            continue
        if local and not (_GLOB & set(path)):
            if not os.path.lexists(path):
                msg = f"--input {item}: no such file or folder"
                raise UsageError(msg)
            out.append((_root_of(path), path))
            continue
        pattern = path + "**" if path.endswith("/") else path
        files = _local_glob(pattern) if local else _remote_match(item, pattern)
        if not files:
            msg = f"--input {item}: no file matches"
            raise UsageError(msg)
        root = _root_of(pattern)
        out += [(root, p) for p in files]
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
    suffix = _compression(low)
    if suffix is not None:
        low = low[: -len(suffix)]
    if low.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            with _open(first) as fh:
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
        with _open(path) as fh:
            for raw in iter(fh.readline, b""):
                if raw.strip():
                    return json.loads(raw)
    except Exception as ex:  # unreadable or not JSON
        msg = f"--input {path}: not readable as JSON Lines ({ex})"
        raise UsageError(msg) from ex
    return None


def missing_model(spec: str) -> UsageError:
    """The usage error of a `--model` that does not exist (as `load_model` words it, whichever
    command meets it)."""
    msg = (
        "expected builtin:NAME, a .safetensors model file or a checkpoint folder, "
        f"got {spec!r}, which does not exist"
    )
    return UsageError(msg)


def _model_vocab(model: str) -> tuple[int | None, str]:
    """(vocab_size or None for a features model, input kind) of a model spec (its header or
    config.json only: no weights are read here)."""
    from linstream.ops.model.runtime import is_model_folder

    cfg: Any
    try:
        if model.startswith("builtin:"):
            from linstream.ops import load_model

            cfg = load_model(model).config
        elif is_model_folder(model):
            from linstream.ops.model.fla.folder import read_folder_config

            cfg = read_folder_config(model)
        else:
            from linstream.ops.model.weights import read_model_header

            with _open(model) as fh:
                head = bytes(fh.read(8))
                n = int.from_bytes(head, "little") if len(head) == 8 else 0
                cfg, _ = read_model_header(head + bytes(fh.read(min(n, 100_000_000))), name=model)
    except FileNotFoundError as ex:
        raise missing_model(model) from ex
    return (cfg.vocab_size if cfg.input_kind == "tokens" else None), cfg.input_kind


# -- the plan -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputPlan:
    """The files of an input, their format and the tokenizer (None for chunk files and token
    lists), checked; made once by `plan_input` and handed to the reader and the counts."""

    config: InputConfig
    format: str
    files: tuple[tuple[str, str], ...]  # (root, path)
    tokenizer: TextTokenizer | None

    def sequence_ids(self, max_files: int = MAX_COUNTED_FILES) -> set[str] | None:
        """The ids of the sequences the input holds, found cheaply (text files: their paths;
        chunk Parquet: the `seq_id` column alone), or None when that would mean reading the
        data (other formats, more than `max_files` files, an unreadable file)."""
        if len(self.files) > max_files:
            return None
        if self.format == "text":
            return {sequence_id(root, path) for root, path in self.files}
        if self.format != "chunks":
            return None
        import pyarrow.parquet as pq

        ids: set[str] = set()
        for _, path in self.files:
            if not_a_regular_file(path) is not None:
                continue
            try:
                with _open(path) as fh:
                    column = pq.read_table(fh, columns=["seq_id"]).column("seq_id")
            except Exception:  # unreadable, or no seq_id column: the reader dead-letters it
                return None
            ids.update(str(v) for v in column.unique().to_pylist() if v is not None)
        return ids

    def token_total(self, max_files: int = MAX_COUNTED_FILES) -> int | None:
        """Tokens the input holds, counted cheaply (Parquet footers; for text read by
        `builtin:bytes`, the files' sizes, a gzip file's from its trailer), or None when that
        would mean reading the data (another compression, another tokenizer, a URL's
        compressed file, more than `max_files` files)."""
        if len(self.files) > max_files:
            return None
        if self.format == "text" and self.tokenizer is not None and self.tokenizer.is_bytes:
            total = 0
            for _, path in self.files:
                size = _text_bytes(path)
                if size is None:
                    return None
                total += size
            return total
        if self.format != "chunks":
            return None
        import pyarrow.parquet as pq

        total = 0
        for _, path in self.files:
            if not_a_regular_file(path) is not None:  # never opened: the reader dead-letters it
                continue
            try:
                with _open(path) as fh:
                    meta = pq.ParquetFile(fh).metadata
            except Exception:  # unreadable: the reader dead-letters or fails it; no total
                return None
            cols = [meta.schema.column(i).path for i in range(meta.num_columns)]
            leaf = next((i for i, c in enumerate(cols) if c.startswith("tokens.")), None)
            if leaf is None:
                return None
            total += sum(
                meta.row_group(g).column(leaf).num_values for g in range(meta.num_row_groups)
            )
        return total


def _text_bytes(path: str) -> int | None:
    """The bytes a text file holds once decompressed: its size; a local gzip file's from the
    size its trailer records (modulo 4 GiB, as gzip records it); None when unknown."""
    suffix = _compression(path)
    if "://" in path:
        if suffix is not None:
            return None
        from apache_beam.io.filesystems import FileSystems

        metas = FileSystems.match([path])[0].metadata_list
        return metas[0].size_in_bytes if metas else 0
    if not_a_regular_file(path) is not None:
        return 0  # never opened: the reader dead-letters it
    try:
        if suffix is None:
            return os.stat(path).st_size
        if suffix != ".gz":
            return None
        with open(path, "rb") as fh:
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return None


def input_files(config: InputConfig) -> list[tuple[str, str]]:
    """(root, path) of every file ``config.input`` names (`expand_input`); UsageError when it
    is not given or matches nothing."""
    spec = config.input
    if not spec:
        msg = "--input is required (a folder of text files, a file or a glob), or --streaming"
        raise UsageError(msg)
    return expand_input(str(spec))


def plan_input(config: InputConfig, files: list[tuple[str, str]] | None = None) -> InputPlan:
    """The `InputPlan` of ``config.input`` (``files``: its `input_files`, when the caller
    listed them already), checked against ``config.model``; UsageError (one line) for an input
    that matches nothing, an unreadable tokenizer or one that does not fit."""
    files = files if files is not None else input_files(config)
    fmt = config.input_format or "auto"
    if fmt == "auto":
        fmt = detect_format(
            [p for _, p in files], config.id_column, config.text_column, config.tokens_column
        )
    if fmt == "text":
        refuse_shared_ids(files)
    if fmt == "chunks":
        return InputPlan(config, fmt, tuple(files), None)
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
    return InputPlan(config, fmt, tuple(files), tokenizer)


def refuse_shared_ids(files: list[tuple[str, str]], what: str = "--input") -> None:
    """A file and a compressed one that would be one sequence (`a.txt` and `a.txt.gz`) are a
    usage error (``what``: the input, as the message names it)."""
    seen: dict[str, str] = {}
    for root, path in files:
        sid = sequence_id(root, path)
        if sid in seen and (_compression(path) or _compression(seen[sid])):
            msg = (
                f"{what}: {seen[sid]} and {path} would both be sequence {sid!r} (a compressed "
                "file's id leaves out its suffix); rename or leave out one of them"
            )
            raise UsageError(msg)
        seen[sid] = path
