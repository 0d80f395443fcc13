"""What the one-line API embeds: texts, files, folders and arrays, each one sequence with an id,
cut into chunks the way `linstream embed` cuts them.

`sources(inputs, ...)` names every sequence and checks it before anything is computed (an empty
text, a file that is not UTF-8 text, token ids outside the model's vocabulary: ValueError
naming the sequence); `Source.chunks()` then yields its chunks lazily: a file read by the
built-in byte tokenizer is read one chunk at a time, so memory stays bounded whatever its size.

Ids follow `linstream embed`, so that a checkpoint folder serves both: a file is named by its
name, a folder's files by their paths relative to it ("notes/a.txt"); texts and arrays in a list
by their position ("0", "1", ...); a mapping's values by its keys.  No Beam here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from linstream.pipeline.io.text_sniff import SNIFF_BYTES, not_text_reason
from linstream.pipeline.io.tokenizers import TextTokenizer

__all__ = ["Source", "sources"]

#: One chunk: (index, payload, final).
Chunk = tuple[int, np.ndarray, bool]


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
            return os.path.getsize(self.value)
        return len(str(self.value).encode("utf-8", "surrogatepass"))

    def chunks(self) -> Iterator[Chunk]:
        """Its chunks in order, the last one final (as `linstream embed` cuts them)."""
        if self.kind == "file" and self.tokenizer.is_bytes:
            yield from _file_chunks(self.value, self.chunk_tokens)
            return
        if self.kind == "file":
            with open(self.value, "rb") as f:
                ids = self.tokenizer.encode_bytes(f.read())
        elif self.kind == "text":
            ids = self.tokenizer.encode(self.value)
        else:
            ids = self.value
        if len(ids) == 0:
            msg = f"sequence {self.seq_id!r}: expected at least one token, got none"
            raise ValueError(msg)
        n = -(-len(ids) // self.chunk_tokens)
        for i in range(n):
            part = ids[i * self.chunk_tokens : (i + 1) * self.chunk_tokens]
            yield i, np.ascontiguousarray(part), i == n - 1


def _file_chunks(path: str, size: int) -> Iterator[Chunk]:
    """A file's bytes as token ids, ``size`` at a time, read one chunk ahead (to mark the last)."""
    with open(path, "rb") as f:
        ahead = f.read(size)
        i = 0
        while ahead:
            nxt = f.read(size)
            yield i, np.frombuffer(ahead, np.uint8).astype(np.int32), not nxt
            ahead, i = nxt, i + 1


def _files_of(path: Path) -> list[tuple[str, str]]:
    """(id, path) of a file (its name) or of every file below a folder (relative paths; hidden
    names skipped), as `linstream embed --input` names them."""
    if path.is_dir():
        found = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                if not name.startswith("."):
                    full = os.path.join(dirpath, name)
                    found.append((os.path.relpath(full, path).replace(os.sep, "/"), full))
        if not found:
            msg = f"{path}: the folder has no files"
            raise ValueError(msg)
        return sorted(found)
    if not path.exists():
        msg = f"{path}: no such file or folder"
        raise FileNotFoundError(msg)
    return [(path.name, str(path))]


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


def _check_array(seq_id: str, arr: np.ndarray, model: Any) -> np.ndarray:
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


def _check_file(seq_id: str, path: str) -> None:
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if not head:
        msg = f"sequence {seq_id!r}: {path} is empty (no tokens to embed)"
        raise ValueError(msg)
    why = not_text_reason(head)
    if why is not None:
        msg = f"sequence {seq_id!r}: {path} is not a text file (UTF-8): found {why}"
        raise ValueError(msg)


def sources(
    inputs: Any, tokenizer: TextTokenizer, chunk_tokens: int, model: Any
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
        if kind == "file":
            _check_file(seq_id, value)
        elif kind == "text" and not value:
            msg = f"sequence {seq_id!r}: an empty text (no tokens to embed)"
            raise ValueError(msg)
        elif kind == "array":
            value = _check_array(seq_id, value, model)
        out.append(Source(seq_id, kind, value, tokenizer, chunk_tokens))
    return out, single
