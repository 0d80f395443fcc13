"""The embed job's options: one frozen `EmbedConfig`, parsed once, whose fields are the flags.

Each field of `EmbedConfig` declares one flag of `linstream embed` (help, parser, default), and
`EMBED_FLAGS`, the table of flags, is read from those fields: the same table builds the command
line (`add_embed_arguments`), deploy launchers' parsers and a Beam `PipelineOptions` view
(`LinstreamOptions`).  A config is built once — `EmbedConfig.from_args(namespace)`,
`.from_options(pipeline_options)` or `.from_dict({...})` — and handed down: the reader gets
`input_config()`, the stateful stage `stage_config()`, the streaming source `stream`.

Every flag has two spellings, `--checkpoint-dir` and `--checkpoint_dir` (Flex Template parameters
and Beam's own options use underscores), and both set the same value.  Boolean flags also take a
value (`--resume=true`, `--streaming=false`), as template parameters carry one.  Every help text
ends with the default, so `--help` shows it.  A default the reader or the stage also has is taken
from there (`InputConfig`, `StageConfig`), never written twice.

No Beam is imported here: the command line reads and checks its flags before Beam is imported.
The Beam `PipelineOptions` view of the same table, `LinstreamOptions`, is made (and Beam
imported) when it is first asked for.

(About 420 lines: most of it is the table of flags itself, one field per flag with its help text.)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from linstream.pipeline.errors import UsageError
from linstream.pipeline.io.reader_config import InputConfig, StreamConfig
from linstream.pipeline.stage.config import DEFAULT_EMBED_EMIT, NO_SEQUENCE_EMIT, StageConfig
from linstream.pipeline.stage.initial_states import parse_initial_state

from .flag_values import (
    DeadLetterLimit,
    chunk_tokens_value,
    dead_letter_limit_text,
    non_negative_float,
    non_negative_int,
    optional_count,
    parse_bool,
    parse_dead_letter_limit,
    positive_int,
)

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

__all__ = [
    "BACKENDS",
    "EMBED_FLAGS",
    "EMIT_CHOICES",
    "INPUT_FORMATS",
    "OUTPUT_MODES",
    "EmbedConfig",
    "Flag",
    "add_embed_arguments",
]

#: `--emit` values (the stateful stage decides what each writes; see README "Output").
EMIT_CHOICES = ("mean", "last", "sequence", "tokens")
#: `--input-format` values; `auto` looks at the input (see `linstream.pipeline.io.text_input`).
INPUT_FORMATS = ("auto", "chunks", "text", "jsonl", "parquet-text", "tokens-jsonl")
#: `--backend` values.
BACKENDS = ("auto", "numpy", "numba", "cupy")
#: `--output-mode` values: what a job does with an output folder that holds results.
OUTPUT_MODES = ("new", "append", "overwrite")


@dataclass(frozen=True)
class Flag:
    """One option: `--name` (with dashes; the underscore spelling is added), its help, parser
    and default.  A field of `EmbedConfig` declares one (`_flag`); its name and default are the
    field's (`EMBED_FLAGS` fills them in)."""

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    metavar: str | None = None
    boolean: bool = False
    required: bool = False
    #: given any number of times (argparse's "append"): a tuple of texts, () when not given
    repeat: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def spellings(self) -> list[str]:
        dashed = f"--{self.name}"
        under = f"--{self.dest}"
        return [dashed] if dashed == under else [dashed, under]

    def check(self, value: Any) -> Any:
        """``value`` as the flag's parser makes it (text, or a value of the wrong kind, is parsed
        as its text); None is "not given" (the default).  UsageError naming the flag."""
        if value is None:
            return self.default
        if self.repeat:
            values = [value] if isinstance(value, str) else list(value)
            return tuple(str(v) for v in values)
        try:
            if self.boolean:
                value = parse_bool(value) if isinstance(value, str) else bool(value)
            elif self.type is not None:
                value = self.type(str(value))
        except argparse.ArgumentTypeError as ex:
            msg = f"--{self.name}: {ex}"
            raise UsageError(msg) from ex
        if self.choices is not None and value not in self.choices:
            msg = f"--{self.name}: expected one of {', '.join(self.choices)}, got {value!r}"
            raise UsageError(msg)
        return value

    def kwargs(self, *, for_beam: bool) -> dict[str, Any]:
        """argparse keywords; Beam's view keeps only JSON-able values (Dataflow sends all
        options to the workers as a JSON struct).  A required flag is checked with the others
        (`launch.check_flags`), not by argparse: an unknown option next to it is named first."""
        shown = "off" if self.boolean and not self.default else self.default
        shown = "none" if shown in (None, ()) else shown
        help_text = f"{self.help} (default: {shown})" if not self.required else self.help
        kw: dict[str, Any] = {"dest": self.dest, "help": help_text.replace("%", "%%")}
        if self.boolean:
            kw.update(
                nargs="?", const=True, default=bool(self.default), type=parse_bool, metavar="BOOL"
            )
            return kw
        if self.repeat:
            kw.update(action="append", default=None)
            if self.metavar is not None:
                kw["metavar"] = self.metavar
            return kw
        kw["default"] = self.default
        if self.type is not None:
            kw["type"] = self.type
        if for_beam and isinstance(self.default, DeadLetterLimit):
            kw["default"], kw["type"] = str(self.default), dead_letter_limit_text
        if self.choices is not None:
            kw["choices"] = list(self.choices)
        if self.metavar is not None:
            kw["metavar"] = self.metavar
        return kw


def _flag(help_text: str, default: Any = None, **spec: Any) -> Any:
    """A field of `EmbedConfig` that is a flag (its name is filled in by `EMBED_FLAGS`)."""
    return field(default=default, metadata={"flag": Flag("", help_text, default, **spec)})


_NO_LIMIT = DeadLetterLimit()


def _default(of: Any, name: str) -> Any:
    """The default of field ``name`` of the dataclass ``of`` (one place for each default)."""
    return next(f.default for f in dataclasses.fields(of) if f.name == name)


@dataclass(frozen=True)
class EmbedConfig:
    """Every option of the embed job, checked (a bad value is a UsageError naming its flag).

    Build it with one of the constructors below (or directly, by field name); hand its parts
    down: `input_config()` to the reader, `stage_config()` to `EmbedSequences`, `stream` to the
    streaming source.  The fields below, in order, are the flags of `linstream embed`.
    """

    input: str | None = _flag(
        "what to embed: a folder of text files, a file, a glob, or globs joined by ','; "
        "local paths or any filesystem Beam knows (gs://, s3://)",
        metavar="PATH",
    )
    input_format: str = _flag(
        "how to read --input: chunks (Parquet rows seq_id, chunk_index, final, tokens|features), "
        "text (one sequence per file, id = path relative to the folder), jsonl / parquet-text "
        "(one sequence per row: --id-column, --text-column), tokens-jsonl (one sequence per "
        "line: --id-column, --tokens-column); auto picks from the files",
        _default(InputConfig, "input_format"),
        choices=INPUT_FORMATS,
    )
    id_column: str = _flag(
        "sequence id column of jsonl / parquet-text / tokens-jsonl rows",
        _default(InputConfig, "id_column"),
    )
    text_column: str = _flag(
        "text column of jsonl / parquet-text rows", _default(InputConfig, "text_column")
    )
    tokens_column: str = _flag(
        "token-id list column of tokens-jsonl rows", _default(InputConfig, "tokens_column")
    )
    tokenizer: str | None = _flag(
        "tokenizer for text input: a tokenizer.json path (local or gs://...) or builtin:bytes "
        "(UTF-8 bytes, ids 0-255, no download); none: a checkpoint folder's tokenizer.json, "
        "the one a model file names, else builtin:bytes",
        metavar="SPEC",
    )
    chunk_tokens: int = _flag(
        "tokens per chunk when linstream chunks text or token lists (the last chunk of a "
        "sequence may be shorter and is marked final), at most the stage's largest chunk "
        f"({_default(StageConfig, 'max_chunk_tokens'):,})",
        _default(InputConfig, "chunk_tokens"),
        type=chunk_tokens_value,
        metavar="N",
    )
    output: str | None = _flag(
        "folder for the results (<output>/results/, Parquet) and the dead letters "
        "(<output>/dead_letters/, JSON Lines)",
        metavar="PATH",
        required=True,
    )
    output_mode: str = _flag(
        "when --output already holds results: new (refuse it, unless --resume continues the "
        "job that wrote them), append (add this job's rows; same --emit, width and model only), "
        "overwrite (delete its results/ and dead_letters/ first)",
        "new",
        choices=OUTPUT_MODES,
    )
    model: str = _flag(
        "builtin:default, a .safetensors model file, or a checkpoint folder in fla's format "
        "(config.json, safetensors, tokenizer.json: GLA, RetNet, DeltaNet, Gated DeltaNet, "
        "HGRN2, RWKV-7, Mamba-2); local or gs://...",
        _default(InputConfig, "model"),
        metavar="SPEC",
    )
    layer: int | None = _flag(
        "with a checkpoint folder: emit hidden state N instead of the final one (0 the "
        "embeddings, N the output of block N, L the final norm); none: the final norm",
        None,
        type=non_negative_int,
        metavar="N",
    )
    checkpoint_dir: str | None = _flag(
        "checkpoint store root (local path or gs://, s3://, memory://); without it nothing "
        "is checkpointed and a stopped job cannot be resumed",
        metavar="PATH",
    )
    resume: bool = _flag(
        "continue every sequence from its last commit in --checkpoint-dir",
        _default(StageConfig, "resume"),
        boolean=True,
    )
    initial_state: tuple[str, ...] = _flag(
        "start each sequence that has no commit yet from a state file (`linstream state "
        "export`): FILE for every sequence, SEQ=FILE for one (repeat the flag); the file must "
        "hold a state of this model and --state-dtype; positions go on from the file's",
        (),
        metavar="[SEQ=]FILE",
        repeat=True,
    )
    keep_every_tokens: int | None = _flag(
        "besides the newest commits, keep each sequence's first commit at or past every "
        "multiple of N tokens (positions to rewind or fork from: `linstream checkpoint "
        "rewind|fork`); recorded in the checkpoint store, so later jobs and `linstream "
        "checkpoint gc` keep it without the flag; 0: none from now on; not given (the "
        "default): the N recorded in the store, else none",
        _default(StageConfig, "keep_every_tokens"),
        type=non_negative_int,
        metavar="N",
    )
    emit: str = _flag(
        "what each output row holds: mean (one vector per chunk, the mean over its tokens), "
        "last (the chunk's last token), sequence (one vector per finished sequence, the mean "
        "over all its tokens), tokens (one vector per token: d_model x 4 bytes per token, "
        "e.g. 512 MB per million tokens of builtin:default)",
        DEFAULT_EMBED_EMIT,
        choices=EMIT_CHOICES,
    )
    backend: str = _flag(
        "kernels: auto (CuPy where a GPU is seen, else Numba), numba, numpy, cupy",
        "auto",
        choices=BACKENDS,
    )
    checkpoint_every: int = _flag(
        "commit each sequence's state every N applied chunks (and at its final chunk)",
        _default(StageConfig, "checkpoint_every"),
        type=positive_int,
        metavar="N",
    )
    restore_fallback: bool = _flag(
        "when a sequence's newest checkpoint is corrupt, continue from the previous one "
        "(logged); without it that sequence's chunks go to the dead letters (restore_failed)",
        _default(StageConfig, "restore_fallback"),
        boolean=True,
    )
    max_buffered_chunks: int | None = _flag(
        "dead-letter (beyond_buffer) chunks more than N ahead of the next one to apply; "
        "none: no bound in Beam state (set one for streaming jobs)",
        _default(StageConfig, "max_buffered_chunks"),
        type=optional_count,
        metavar="N|none",
    )
    idle_timeout: float = _flag(
        "event-time seconds after which an idle, committed sequence's Beam state is cleared",
        _default(StageConfig, "idle_timeout"),
        type=non_negative_float,
        metavar="S",
    )
    state_dtype: str = _flag(
        "carried state (S, z) dtype", "float64", choices=("float64", "float32")
    )
    compute_dtype: str = _flag(
        "the model's compute dtype: float32, float64, or bfloat16 (a checkpoint folder's "
        "models: weights held in 16 bits, float32 outputs; the state and its checkpoints as "
        "in float32)",
        "float32",
        choices=("float32", "float64", "bfloat16"),
    )
    num_shards: int = _flag(
        "result files per window (0: the runner decides)",
        0,
        type=non_negative_int,
        metavar="N",
    )
    progress_every: float = _flag(
        "seconds between progress lines (done/total, tokens/s, ETA); 0 turns them off",
        10.0,
        type=non_negative_float,
        metavar="S",
    )
    max_dead_letters: DeadLetterLimit = field(  # `_flag`, for a default that is an object
        default=_NO_LIMIT,
        metadata={
            "flag": Flag(
                "",
                "exit 3 when dead letters pass N (a count) or P% of all chunks; in every case a "
                "restore_failed dead letter, or a job whose chunks all went to the dead letters, "
                "exits 3",
                _NO_LIMIT,
                type=parse_dead_letter_limit,
                metavar="N|P%",
            )
        },
    )
    threads: int | None = _flag(
        "threads of the kernels (Numba) and of BLAS in each process of the job on this machine, "
        "as llama.cpp's -t and PyTorch's set_num_threads; none: every core (workers of a remote "
        "runner use their own machine's)",
        None,
        type=positive_int,
        metavar="N",
    )
    streaming: bool = _flag(
        "read an unbounded source (--pubsub_subscription, --kafka_topic, ...)",
        False,
        boolean=True,
    )
    window_seconds: float = _flag(
        "output window length with --streaming",
        60.0,
        type=non_negative_float,
        metavar="S",
    )
    #: The streaming source (its own flags: `linstream.pipeline.io.streaming`).
    stream: StreamConfig = field(default_factory=StreamConfig)

    def __post_init__(self) -> None:
        for flag in EMBED_FLAGS:
            object.__setattr__(self, flag.dest, flag.check(getattr(self, flag.dest)))
        try:
            parse_initial_state(self.initial_state)
        except ValueError as ex:
            raise UsageError(str(ex)) from None
        if self.initial_state and self.emit == "sequence":
            msg = f"--initial-state: {NO_SEQUENCE_EMIT}"
            raise UsageError(msg)

    # -- built once, from what the caller has --------------------------------------------------
    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EmbedConfig:
        """From a parsed command line (`linstream embed`'s, a launcher's); the namespace's other
        attributes (the command, -v, a launcher's own flags) are not options and stay there."""
        return cls._of(vars(args))

    @classmethod
    def from_options(cls, options: PipelineOptions) -> EmbedConfig:
        """From Beam pipeline options (a Flex Template launcher's, `PipelineOptions(argv)`): the
        `LinstreamOptions` view, and the streaming source options given beside it."""
        view = options.view_as(_linstream_options())
        return cls._of(view.get_all_options(retain_unknown_options=True))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EmbedConfig:
        """From option names (the underscore spelling, `checkpoint_dir`) and values, as text or
        as values; an unknown name is a UsageError."""
        unknown = sorted(set(values) - _FLAG_NAMES - _STREAM_NAMES)
        if unknown:
            msg = (
                f"unknown embed option {unknown[0]!r}; expected some of "
                f"{', '.join(sorted(_FLAG_NAMES | _STREAM_NAMES))}"
            )
            raise UsageError(msg)
        return cls._of(values)

    @classmethod
    def _of(cls, values: Mapping[str, Any]) -> EmbedConfig:
        given = {name: values[name] for name in _FLAG_NAMES if name in values}
        stream = {n: values[n] for n in _STREAM_NAMES if values.get(n) is not None}
        return cls(**given, stream=StreamConfig(**stream))

    # -- the parts handed down -----------------------------------------------------------------
    @property
    def commits_outputs(self) -> bool:
        """Whether the stage writes each span of results as part of the commit that covers it
        (with a checkpoint store: exactly once across crashes); else Beam's file sink does."""
        return bool(self.checkpoint_dir) and self.output is not None

    def input_config(self) -> InputConfig:
        """What `read_input` reads."""
        return InputConfig(
            input=self.input,
            input_format=self.input_format,
            id_column=self.id_column,
            text_column=self.text_column,
            tokens_column=self.tokens_column,
            tokenizer=self.tokenizer,
            chunk_tokens=self.chunk_tokens,
            model=self.model,
        )

    def stage_config(self, *, total_tokens: int | None = None) -> StageConfig:
        """How the stateful stage runs; ``total_tokens`` (counted before the run, when it can be)
        gives the progress line its ETA."""
        return StageConfig(
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_every=self.checkpoint_every,
            resume=self.resume,
            max_buffered_chunks=self.max_buffered_chunks,
            idle_timeout=self.idle_timeout,
            emit=self.emit,
            progress_every_s=self.progress_every or None,
            restore_fallback=self.restore_fallback,
            output_dir=self.output if self.commits_outputs else None,
            total_tokens=total_tokens,
            keep_every_tokens=self.keep_every_tokens,
            initial_state=parse_initial_state(self.initial_state),
        )


_FLAG_NAMES = frozenset(f.name for f in dataclasses.fields(EmbedConfig) if "flag" in f.metadata)
_STREAM_NAMES = frozenset(f.name for f in dataclasses.fields(StreamConfig))


def _flags() -> tuple[Flag, ...]:
    return tuple(
        dataclasses.replace(f.metadata["flag"], name=f.name.replace("_", "-"), default=f.default)
        for f in dataclasses.fields(EmbedConfig)
        if "flag" in f.metadata
    )


#: The flags of `linstream embed`, one per field of `EmbedConfig`, in its order.
EMBED_FLAGS: tuple[Flag, ...] = _flags()


def add_embed_arguments(parser: argparse.ArgumentParser, *, for_beam: bool = False) -> None:
    """Add every flag of `EMBED_FLAGS` (both spellings) that `parser` does not have yet."""
    known = set(parser._option_string_actions)
    for flag in EMBED_FLAGS:
        names = [s for s in flag.spellings() if s not in known]
        if len(names) < len(flag.spellings()):  # e.g. Beam's own --streaming
            continue
        parser.add_argument(*names, **flag.kwargs(for_beam=for_beam))


@functools.cache
def _linstream_options() -> type[PipelineOptions]:
    """`LinstreamOptions`, made on first use (it imports Beam)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    class LinstreamOptions(PipelineOptions):
        """linstream's embed options as a Beam `PipelineOptions` view.

        `PipelineOptions(argv).view_as(LinstreamOptions)` reads `--checkpoint_dir` and
        `--checkpoint-dir` alike, so a Flex Template launcher needs no argv rewriting.
        """

        @classmethod
        def _add_argparse_args(cls, parser: Any) -> None:
            add_embed_arguments(parser, for_beam=True)

    LinstreamOptions.__module__ = __name__
    return LinstreamOptions


def __getattr__(name: str) -> Any:
    if name == "LinstreamOptions":  # the Beam view: made (and Beam imported) on first use
        return _linstream_options()
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
