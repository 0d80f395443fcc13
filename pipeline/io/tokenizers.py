"""Tokenizers for text input: the built-in byte tokenizer and Hugging Face `tokenizer.json` files.

`builtin:bytes` reads any text with no download: token ids are the text's UTF-8 bytes (0-255),
so it fits every token model with a vocabulary of at least 256 ids (`builtin:default` has 4096).
`byte_tokenizer()` is the same thing as a Hugging Face `tokenizers.Tokenizer` (a byte-level BPE
with no merges), for training or saving; both encode every text to the same ids.

A tokenizer travels as its JSON text (`TextTokenizer.json`), never pickled: it is read once where
the pipeline is built and handed to the workers as a string.  A model file may name its tokenizer
in its safetensors metadata (key `tokenizer`: `builtin:bytes`, a path or URL, or a path relative to
the model file's folder); `resolve_tokenizer` finds it and checks that every id it can produce
fits the model's vocabulary.  A checkpoint folder in fla's format gives its own tokenizer.json
(a folder with only SentencePiece's tokenizer.model is refused in one line saying what to add).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

import numpy as np

__all__ = [
    "BUILTIN_BYTES",
    "TextTokenizer",
    "TokenizerError",
    "byte_tokenizer",
    "model_tokenizer_spec",
    "read_text",
    "resolve_tokenizer",
]

BUILTIN_BYTES = "builtin:bytes"


class TokenizerError(ValueError):
    """A tokenizer that cannot be read, or that does not fit the model."""


def _bytes_to_unicode() -> dict[int, str]:
    """The printable stand-in character of each byte that byte-level BPE tokenizers use."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def byte_tokenizer() -> Any:
    """`builtin:bytes` as a Hugging Face `Tokenizer`: id = UTF-8 byte value, 256 ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _open(path: str) -> Any:
    """A local file with `open` (no Beam needed: the one-line API reads local files), anything
    else with Beam's filesystems (gs://, s3://)."""
    if "://" not in path:
        return open(path, "rb")
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(path)


def read_text(path: str) -> str:
    """The text of a local or remote file (Beam filesystems), as UTF-8."""
    with _open(path) as fh:
        return bytes(fh.read()).decode("utf-8")


class TextTokenizer:
    """Text -> int32 token ids, built from a spec (`builtin:bytes`) or a tokenizer's JSON text.

    Picklable by value (the JSON text), so it can sit in a DoFn; the Hugging Face object is
    built lazily on first use.
    """

    def __init__(self, spec: str = BUILTIN_BYTES, *, json_text: str | None = None) -> None:
        if spec != BUILTIN_BYTES and json_text is None:
            msg = f"tokenizer {spec!r}: give its JSON text (use resolve_tokenizer to read a file)"
            raise TokenizerError(msg)
        self.spec = spec
        self.json = json_text
        self._tok: Any = None
        if json_text is not None:
            self._build()  # fail here, where the pipeline is built, not on a worker

    def _build(self) -> Any:
        if self._tok is None and self.json is not None:
            from tokenizers import Tokenizer

            try:
                self._tok = Tokenizer.from_str(self.json)
            except Exception as ex:  # tokenizers raises its own exception type
                msg = f"tokenizer {self.spec}: not a Hugging Face tokenizer.json ({ex})"
                raise TokenizerError(msg) from ex
        return self._tok

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "json": self.json}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec, self.json, self._tok = state["spec"], state["json"], None

    @property
    def is_bytes(self) -> bool:
        return self.json is None

    @property
    def vocab_size(self) -> int:
        """How many ids it can produce (ids are 0..vocab_size-1)."""
        if self.is_bytes:
            return 256
        return int(self._build().get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> np.ndarray:
        """Token ids [T] (int32) of `text`."""
        if self.is_bytes:
            return np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8).astype(np.int32)
        ids = self._build().encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.int32)

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """Token ids of a file's bytes: raw bytes for `builtin:bytes`, else its UTF-8 text."""
        if self.is_bytes:
            return np.frombuffer(data, np.uint8).astype(np.int32)
        return self.encode(data.decode("utf-8"))

    def check_fits(self, vocab_size: int, model: str) -> None:
        """Refuse a tokenizer whose ids would not all be valid token ids of the model."""
        if self.vocab_size > vocab_size:
            msg = (
                f"tokenizer {self.spec} produces ids 0..{self.vocab_size - 1}, but model {model} "
                f"reads ids 0..{vocab_size - 1} (vocabulary {vocab_size}); use the tokenizer the "
                f"model was trained with, or train a model with vocab_size >= {self.vocab_size}"
            )
            raise TokenizerError(msg)

    def __repr__(self) -> str:
        return f"TextTokenizer({self.spec!r})"


def _is_absolute(spec: str) -> bool:
    return "://" in spec or os.path.isabs(spec) or spec.startswith("builtin:")


def _join(base: str, rel: str) -> str:
    if "://" in base:
        return posixpath.join(posixpath.dirname(base), rel)
    return os.path.join(os.path.dirname(base), rel)


def model_tokenizer_spec(model: str) -> str | None:
    """The tokenizer a model file names in its metadata (resolved against its folder), or None;
    a checkpoint folder's tokenizer.json (TokenizerError when it has none)."""
    if model.startswith("builtin:"):
        return None
    from linstream.ops.model.runtime import is_model_folder

    if is_model_folder(model):
        from linstream.ops.model.fla.folder import folder_tokenizer

        path, problem = folder_tokenizer(model)
        if path is None:
            msg = (
                f"--tokenizer not given and {problem}: add the model's tokenizer.json there, "
                f"pass --tokenizer PATH, or --tokenizer {BUILTIN_BYTES} to read text as UTF-8 "
                "bytes (ids 0-255, meaningful only for a model trained on bytes)"
            )
            raise TokenizerError(msg)
        return path
    from linstream.ops.model.weights import read_model_header

    with _open(model) as fh:
        head = bytes(fh.read(8))
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        data = head + bytes(fh.read(min(n, 100_000_000)))
    _config, named = read_model_header(data, name=model)
    if not named:
        return None
    return named if _is_absolute(named) else _join(model, named)


def resolve_tokenizer(spec: str | None, model: str | None = None) -> TextTokenizer:
    """The tokenizer for `spec`: `builtin:bytes`, a tokenizer.json path/URL, or (None) the one
    the model file names, else `builtin:bytes`.  Raises TokenizerError naming the file."""
    if spec is None and model is not None:
        spec = model_tokenizer_spec(model)
    if spec is None or spec == BUILTIN_BYTES:
        return TextTokenizer(BUILTIN_BYTES)
    if spec.startswith("builtin:"):
        msg = f"unknown built-in tokenizer {spec!r}; available: {BUILTIN_BYTES}"
        raise TokenizerError(msg)
    try:
        text = read_text(spec)
    except (OSError, UnicodeDecodeError) as ex:
        msg = f"tokenizer {spec}: cannot read it ({type(ex).__name__}: {ex})"
        raise TokenizerError(msg) from ex
    except Exception as ex:  # Beam's filesystems raise BeamIOError for a missing file
        msg = f"tokenizer {spec}: cannot read it ({ex})"
        raise TokenizerError(msg) from ex
    return TextTokenizer(spec, json_text=text)
