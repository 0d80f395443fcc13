"""What the one-line API embeds: texts, files, folders and arrays, each one sequence with an id,
cut into chunks the way `linstream embed` cuts them.

`sources(inputs, ...)` names every sequence and checks what the caller passed directly before
anything is computed (an empty text, token ids outside the model's vocabulary, two inputs of one
id: ValueError naming the sequence).  `Source.chunks()` then yields its chunks lazily, through
the command line's own code: text is cut by `ToChunks`' `sequence_chunks`, and files are read
by the embed job's reader (`read_text_file`, Beam's filesystems: a compressed file is read
decompressed), so a file that is not UTF-8 text, cannot be read or has no tokens yields the
dead letter `linstream embed` writes for it.  A file read by the built-in byte tokenizer is read
one chunk at a time, so memory stays bounded whatever its size.

Ids follow `linstream embed`, so that a checkpoint folder serves both: a file is named by its
name, a folder's files by their paths relative to it ("notes/a.txt"); texts and arrays in a list
by their position ("0", "1", ...); a mapping's values by its keys.  Texts and arrays need no
Beam; reading files imports Beam's filesystems.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from linstream.ops.model.protocol import StreamingModel
from linstream.pipeline.io.text_chunks import cut, sequence_chunks
from linstream.pipeline.io.tokenizers import TextTokenizer
from linstream.pipeline.values import Chunk, DeadLetter

__all__ = ["Source", "sources"]


@dataclass(frozen=True)
class Source:
    """One sequence: a text, a file or an array, and how to cut it."""

    seq_id: str
    kind: str  # "text", "file" or "array"
    value: Any
    tokenizer: TextTokenizer
    chunk_tokens: int

    @property
    def tokens(self) -> int | None:
        """Its length in tokens when known without tokenizing (else None)."""
        if self.kind == "array":
            return len(self.value)
        if not self.tokenizer.is_bytes:
            return None
        if self.kind == "file":
            try:
                return os.path.getsize(self.value)
            except OSError:  # the reader says what is wrong with it
                return None
        return len(str(self.value).encode("utf-8", "surrogatepass"))

    def chunks(self) -> Iterator[Chunk | DeadLetter]:
        """Its chunks in order, the last one final (as `linstream embed` cuts them), or the
        dead letter that says why it has none (a dead letter after chunks: reading the file
        failed part way, and `linstream embed` keeps none of its chunks)."""
        if self.kind == "file":
            yield from self._file_chunks()
        elif self.kind == "text":
            yield from _each(
                sequence_chunks(self.seq_id, self.value, self.tokenizer, self.chunk_tokens)
            )
        else:
            yield from cut(self.seq_id, self.value, self.chunk_tokens)

    def _file_chunks(self) -> Iterator[Chunk | DeadLetter]:
        from linstream.pipeline.io.text_input import read_text_file

        seq_id, tok, size = self.seq_id, self.tokenizer, self.chunk_tokens
        if not tok.is_bytes:  # the tokenizer reads the whole text, as the job's does
            for part in read_text_file(seq_id, self.value, require_text=True):
                if isinstance(part, DeadLetter):
                    yield part
                else:
                    yield from _each(sequence_chunks(seq_id, part, tok, size))
            return
        # The byte tokenizer: a chunk's ids are its bytes, read one chunk ahead (to mark the last).
        ahead: bytes | None = None
        i = 0
        for part in read_text_file(seq_id, self.value, require_text=True, piece=size):
            if isinstance(part, DeadLetter):
                yield part
                return
            if ahead is not None:
                yield Chunk(seq_id, i, tok.encode_bytes(ahead), final=False)
                i += 1
            ahead = part
        if ahead is None:  # an empty file: the dead letter the job gives it
            yield from _each(sequence_chunks(seq_id, b"", tok, size))
        else:
            yield Chunk(seq_id, i, tok.encode_bytes(ahead), final=True)


def _each(chunks: list[Chunk] | DeadLetter) -> list[Chunk | DeadLetter]:
    return [chunks] if isinstance(chunks, DeadLetter) else list(chunks)


def _files_of(path: Path) -> list[tuple[str, str]]:
    """(id, path) of a file (its name) or of every file below a folder (relative paths; hidden
    names skipped), as `linstream embed --input` lists and names them."""
    from linstream.pipeline.io.input_plan import folder_files, refuse_shared_ids, sequence_id

    where = str(path)
    if path.is_dir():
        found = folder_files(where)
        if not found:
            msg = f"{path}: the folder has no files"
            raise ValueError(msg)
        refuse_shared_ids([(where, p) for p in found], what=where)  # a.txt beside a.txt.gz
        return [(sequence_id(where, p), p) for p in found]
    if not path.exists():
        msg = f"{path}: no such file or folder"
        raise FileNotFoundError(msg)
    return [(sequence_id(os.path.dirname(where) or ".", where), where)]


def _is_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    return isinstance(value, (list, tuple)) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value
    )


def _named(inputs: Any) -> tuple[list[tuple[str, str, Any]], bool]:
    """[(id, kind, value)] of ``inputs``, and whether it was one text (one result, not a list)."""
    if isinstance(inputs, str):
        return [("0", "text", inputs)], True
    if isinstance(inputs, os.PathLike):
        return [(i, "file", p) for i, p in _files_of(Path(inputs))], False
    if isinstance(inputs, np.ndarray):
        return [("0", "array", inputs)], True
    out: list[tuple[str, str, Any]] = []
    items: Iterable[tuple[str | None, Any]]
    if isinstance(inputs, Mapping):
        items = ((str(k), v) for k, v in inputs.items())
    elif isinstance(inputs, Iterable):
        items = ((None, v) for v in inputs)
    else:
        msg = (
            "expected a text, a path, a list of texts, paths or token-id arrays, or a mapping "
            f"from ids to them; got {type(inputs).__name__}"
        )
        raise TypeError(msg)
    for n, (key, value) in enumerate(items):
        if isinstance(value, os.PathLike):
            files = _files_of(Path(value))
            if key is not None and len(files) == 1:
                out.append((key, "file", files[0][1]))
            else:
                prefix = "" if key is None else f"{key}/"
                out += [(f"{prefix}{i}", "file", p) for i, p in files]
        elif isinstance(value, str):
            out.append((key if key is not None else str(n), "text", value))
        elif _is_array(value):
            out.append((key if key is not None else str(n), "array", np.asarray(value)))
        else:
            where = f"item {key!r}" if key is not None else f"item {n}"
            msg = f"{where}: expected a text, a path or an array, got {type(value).__name__}"
            raise TypeError(msg)
    return out, False


def _check_array(seq_id: str, arr: np.ndarray, model: StreamingModel) -> np.ndarray:
    cfg = model.config
    if cfg.input_kind == "tokens" and arr.dtype.kind in "iu":
        arr = arr.astype(np.int64, copy=False)
    elif cfg.input_kind != "tokens" and arr.dtype.kind == "f":
        arr = arr.astype(np.float32, copy=False)
    try:
        model.check_inputs(arr)
    except (TypeError, ValueError) as ex:
        msg = f"sequence {seq_id!r}: {ex}"
        raise ValueError(msg) from ex
    return arr


def sources(
    inputs: Any, tokenizer: TextTokenizer, chunk_tokens: int, model: StreamingModel
) -> tuple[list[Source], bool]:
    """Every sequence of ``inputs``, checked (see the module docstring); and whether the input
    was a single text or array (whose result is one row, not a list of rows)."""
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        msg = f"chunk_tokens: expected a whole number >= 1, got {chunk_tokens!r}"
        raise ValueError(msg)
    named, single = _named(inputs)
    seen: set[str] = set()
    out = []
    text_model = model.config.input_kind == "tokens"
    for seq_id, kind, value in named:
        if seq_id in seen:
            msg = f"two inputs have the id {seq_id!r}; give them ids of their own (a mapping)"
            raise ValueError(msg)
        seen.add(seq_id)
        if kind != "array" and not text_model:
            msg = f"sequence {seq_id!r}: model reads feature vectors, not text; give arrays"
            raise ValueError(msg)
        if kind == "text" and not value:
            msg = f"sequence {seq_id!r}: an empty text (no tokens to embed)"
            raise ValueError(msg)
        if kind == "array":
            value = _check_array(seq_id, value, model)
        out.append(Source(seq_id, kind, value, tokenizer, chunk_tokens))
    return out, single
