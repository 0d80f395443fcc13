"""The embed job's options: one table of flags, used by `linstream embed`, by deploy launchers and
by Beam itself (`LinstreamOptions`, a `PipelineOptions` view).

Every flag has two spellings, `--checkpoint-dir` and `--checkpoint_dir` (Flex Template parameters
and Beam's own options use underscores), and both set the same value.  Boolean flags also take a
value (`--resume=true`, `--streaming=false`), as template parameters carry one.  Every help text
ends with the default, so `--help` shows it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions
from linstream.pipeline.errors import UsageError

__all__ = [
    "EMBED_FLAGS",
    "EMIT_CHOICES",
    "INPUT_FORMATS",
    "DeadLetterLimit",
    "Flag",
    "LinstreamOptions",
    "UsageError",
    "add_embed_arguments",
    "parse_bool",
    "parse_dead_letter_limit",
]

#: `--emit` values (the stateful stage decides what each writes; see README "Output").
EMIT_CHOICES = ("mean", "last", "sequence", "tokens")
#: `--input-format` values; `auto` looks at the input (see `linstream.pipeline.io.text_input`).
INPUT_FORMATS = ("auto", "chunks", "text", "jsonl", "parquet-text", "tokens-jsonl")

_TRUE = {"true", "1", "yes", "on"}


_FALSE = {"false", "0", "no", "off"}


def parse_bool(value: str) -> bool:
    """`true|false|1|0|yes|no|on|off` (any case) as a bool."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    msg = f"expected true or false, got {value!r}"
    raise argparse.ArgumentTypeError(msg)


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        msg = f"expected a whole number >= 1, got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return n


def _non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        msg = f"expected a whole number >= 0, got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return n


def _optional_count(value: str) -> int | None:
    """`none` (no bound) or a whole number >= 0."""
    if value.strip().lower() == "none":
        return None
    return _non_negative_int(value)


def _non_negative_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not x >= 0:
        msg = f"expected a number >= 0, got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return x


@dataclass(frozen=True)
class DeadLetterLimit:
    """`--max-dead-letters`: None (no count limit), a count, or a percentage of all chunks."""

    count: int | None = None
    percent: float | None = None

    def exceeded(self, dead: int, chunks: int) -> bool:
        """Whether `dead` dead letters, beside `chunks` applied chunks, pass the limit."""
        if self.count is not None:
            return dead > self.count
        if self.percent is not None:
            total = dead + chunks
            return total > 0 and 100.0 * dead / total > self.percent
        return False

    def __str__(self) -> str:
        if self.count is not None:
            return str(self.count)
        if self.percent is not None:
            return f"{self.percent:g}%"
        return "none"


def parse_dead_letter_limit(value: str | DeadLetterLimit) -> DeadLetterLimit:
    """`none`, `N` (a count) or `P%` (a percentage of chunks + dead letters)."""
    if isinstance(value, DeadLetterLimit):
        return value
    v = value.strip().lower()
    if v in ("none", ""):
        return DeadLetterLimit()
    m = re.fullmatch(r"(\d+(?:\.\d*)?)%", v)
    if m and float(m.group(1)) <= 100:
        return DeadLetterLimit(percent=float(m.group(1)))
    if v.isdigit():
        return DeadLetterLimit(count=int(v))
    msg = f"expected none, a count N or a percentage P% (0-100), got {value!r}"
    raise argparse.ArgumentTypeError(msg)


def _dead_letter_limit_text(value: str) -> str:
    return str(parse_dead_letter_limit(value))


@dataclass(frozen=True)
class Flag:
    """One option: `--name` (with dashes; the underscore spelling is added), its value and help."""

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    metavar: str | None = None
    boolean: bool = False
    required: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def spellings(self) -> list[str]:
        dashed = f"--{self.name}"
        under = f"--{self.dest}"
        return [dashed] if dashed == under else [dashed, under]

    def kwargs(self, *, for_beam: bool) -> dict[str, Any]:
        """argparse keywords; Beam's view keeps only JSON-able values (Dataflow sends all
        options to the workers as a JSON struct)."""
        shown = "off" if self.boolean and not self.default else self.default
        shown = "none" if shown is None else shown
        help_text = f"{self.help} (default: {shown})" if not self.required else self.help
        kw: dict[str, Any] = {"dest": self.dest, "help": help_text.replace("%", "%%")}
        if self.boolean:
            kw.update(
                nargs="?", const=True, default=bool(self.default), type=parse_bool, metavar="BOOL"
            )
            return kw
        kw["default"] = self.default
        if self.type is not None:
            kw["type"] = self.type
        if for_beam and isinstance(self.default, DeadLetterLimit):
            kw["default"], kw["type"] = str(self.default), _dead_letter_limit_text
        if self.choices is not None:
            kw["choices"] = list(self.choices)
        if self.metavar is not None:
            kw["metavar"] = self.metavar
        if self.required and not for_beam:  # Beam parses every view's flags: never required there
            kw["required"] = True
        return kw


EMBED_FLAGS: tuple[Flag, ...] = (
    Flag(
        "input",
        "what to embed: a folder of text files, a file, a glob, or globs joined by ','; "
        "local paths or any filesystem Beam knows (gs://, s3://)",
        metavar="PATH",
    ),
    Flag(
        "input-format",
        "how to read --input: chunks (Parquet rows seq_id, chunk_index, final, tokens|features), "
        "text (one sequence per file, id = path relative to the folder), jsonl / parquet-text "
        "(one sequence per row: --id-column, --text-column), tokens-jsonl (one sequence per "
        "line: --id-column, --tokens-column); auto picks from the files",
        default="auto",
        choices=INPUT_FORMATS,
    ),
    Flag("id-column", "sequence id column of jsonl / parquet-text / tokens-jsonl rows", "id"),
    Flag("text-column", "text column of jsonl / parquet-text rows", "text"),
    Flag("tokens-column", "token-id list column of tokens-jsonl rows", "tokens"),
    Flag(
        "tokenizer",
        "tokenizer for text input: a tokenizer.json path (local or gs://...) or builtin:bytes "
        "(UTF-8 bytes, ids 0-255, no download); none: the one the model file names, else "
        "builtin:bytes",
        metavar="SPEC",
    ),
    Flag(
        "chunk-tokens",
        "tokens per chunk when linstream chunks text or token lists (the last chunk of a "
        "sequence may be shorter and is marked final)",
        2048,
        type=_positive_int,
        metavar="N",
    ),
    Flag(
        "output",
        "folder for the results (<output>/results/, Parquet) and the dead letters "
        "(<output>/dead_letters/, JSON Lines)",
        metavar="PATH",
        required=True,
    ),
    Flag(
        "model",
        "builtin:default or a .safetensors model file (local or gs://...)",
        "builtin:default",
        metavar="SPEC",
    ),
    Flag(
        "checkpoint-dir",
        "checkpoint store root (local path or gs://, s3://, memory://); without it nothing "
        "is checkpointed and a stopped job cannot be resumed",
        metavar="PATH",
    ),
    Flag(
        "resume",
        "continue every sequence from its last commit in --checkpoint-dir",
        False,
        boolean=True,
    ),
    Flag(
        "emit",
        "what each output row holds: mean (one vector per chunk, the mean over its tokens), "
        "last (the chunk's last token), sequence (one vector per finished sequence, the mean "
        "over all its tokens), tokens (one vector per token: d_model x 4 bytes per token, "
        "e.g. 512 MB per million tokens of builtin:default)",
        "mean",
        choices=EMIT_CHOICES,
    ),
    Flag(
        "backend",
        "kernels: auto (CuPy where a GPU is seen, else Numba), numba, numpy, cupy",
        "auto",
        choices=("auto", "numpy", "numba", "cupy"),
    ),
    Flag(
        "checkpoint-every",
        "commit each sequence's state every N applied chunks (and at its final chunk)",
        16,
        type=_positive_int,
        metavar="N",
    ),
    Flag(
        "restore-fallback",
        "when a sequence's newest checkpoint is corrupt, continue from the previous one "
        "(logged); without it that sequence's chunks go to the dead letters (restore_failed)",
        False,
        boolean=True,
    ),
    Flag(
        "max-buffered-chunks",
        "dead-letter (beyond_buffer) chunks more than N ahead of the next one to apply; "
        "none: no bound in Beam state (set one for streaming jobs)",
        None,
        type=_optional_count,
        metavar="N|none",
    ),
    Flag(
        "idle-timeout",
        "event-time seconds after which an idle, committed sequence's Beam state is cleared",
        300.0,
        type=_non_negative_float,
        metavar="S",
    ),
    Flag("state-dtype", "carried state (S, z) dtype", "float64", choices=("float64", "float32")),
    Flag(
        "num-shards",
        "result files per window (0: the runner decides)",
        0,
        type=_non_negative_int,
        metavar="N",
    ),
    Flag(
        "progress-every",
        "seconds between progress lines (done/total, tokens/s, ETA); 0 turns them off",
        10.0,
        type=_non_negative_float,
        metavar="S",
    ),
    Flag(
        "max-dead-letters",
        "exit 3 when dead letters pass N (a count) or P% of all chunks; in every case a "
        "restore_failed dead letter, or a job whose chunks all went to the dead letters, "
        "exits 3",
        DeadLetterLimit(),
        type=parse_dead_letter_limit,
        metavar="N|P%",
    ),
    Flag(
        "streaming",
        "read an unbounded source (--pubsub_subscription, --kafka_topic, ...)",
        False,
        boolean=True,
    ),
    Flag(
        "window-seconds",
        "output window length with --streaming",
        60.0,
        type=_non_negative_float,
        metavar="S",
    ),
)


def add_embed_arguments(parser: argparse.ArgumentParser, *, for_beam: bool = False) -> None:
    """Add every flag of `EMBED_FLAGS` (both spellings) that `parser` does not have yet."""
    known = set(parser._option_string_actions)
    for flag in EMBED_FLAGS:
        names = [s for s in flag.spellings() if s not in known]
        if len(names) < len(flag.spellings()):  # e.g. Beam's own --streaming
            continue
        parser.add_argument(*names, **flag.kwargs(for_beam=for_beam))


class LinstreamOptions(PipelineOptions):
    """linstream's embed options as a Beam `PipelineOptions` view.

    `PipelineOptions(argv).view_as(LinstreamOptions)` reads `--checkpoint_dir` and
    `--checkpoint-dir` alike, so a Flex Template launcher needs no argv rewriting.
    """

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        add_embed_arguments(parser, for_beam=True)
