"""How the stateful stage runs: one frozen `StageConfig`, checked once when it is built.

Both transforms take its fields as keyword arguments (`CausalLinearAttention(checkpoint_dir=...,
checkpoint_every=...)`) or whole (`stage=StageConfig(...)`); the embed job builds one from its
flags.  The field list below is the only place the stage's options are spelled out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_EMBED_EMIT",
    "EMIT_MODES",
    "MAX_CHUNK_TOKENS",
    "NO_SEQUENCE_EMIT",
    "StageConfig",
]

#: Why an initial state and emit "sequence" do not go together.
NO_SEQUENCE_EMIT = (
    "initial state with emit 'sequence': the mean over all of a sequence's tokens needs the "
    "outputs of the tokens before the state, which a state file does not hold; use emit mean, "
    "last or tokens"
)

#: tokens: one vector per token; mean / last: one per chunk; sequence: one per finished sequence
#: (the mean over all its tokens, from a running sum carried with the state).
EMIT_MODES = ("tokens", "mean", "last", "sequence")
#: What `EmbedSequences` and `linstream embed` emit unless told: one vector per chunk, the mean
#: of its tokens' embeddings.  (`CausalLinearAttention` and a bare `StageConfig` emit "tokens".)
DEFAULT_EMBED_EMIT = "mean"
#: The longest chunk the stage takes by default (longer ones are `too_large` dead letters; the
#: most `linstream embed --chunk-tokens` accepts).
MAX_CHUNK_TOKENS = 1 << 20


@dataclass(frozen=True)
class StageConfig:
    """The stateful stage's options (a bad value raises ValueError with one line).

    checkpoint_dir: a CheckpointStore root (local path or any fsspec/Beam URL) or None.
    checkpoint_every: commit after this many applied chunks (and always at the final chunk).
    checkpoint_keep: commits kept per sequence (a corrupt newest one has a fallback).
    resume: restore each sequence from the store the first time it is seen.
    max_buffered_chunks: how far ahead of the next chunk to apply a chunk may be buffered;
        farther ones are dead-lettered (`beyond_buffer`).  None (the default): no bound — early
        chunks wait in Beam state, and the stage reads them back in batches of bounded bytes.
        Set a bound for streaming jobs whose gaps may never close.
    idle_timeout: event-time seconds after a sequence's last chunk before its Beam state is
        committed and cleared (in a batch job: at the end of the input).
    emit: what each result holds, one of `EMIT_MODES`.
    progress_every_s: seconds between progress lines (None: none).
    restore_fallback: continue past a corrupt newest commit from the one before (logged by the
        store); without it the sequence's chunks are dead-lettered (`restore_failed`).
    output_dir: write each span of results as part of the checkpoint commit that covers it,
        under `<output_dir>/results/` (exactly once across crashes and resumes; needs
        checkpoint_dir).  Results are still emitted on the main output.
    max_chunk_tokens: longer chunks are dead-lettered (`too_large`) before any work; chunks are
        computed in blocks of `block_tokens` tokens, so memory stays bounded.
    block_tokens: see max_chunk_tokens.
    total_tokens: the input's token count when known (the progress line's ETA).
    keep_every_tokens: besides the newest ``checkpoint_keep`` commits, keep the first commit at
        or past each multiple of this many tokens, so a sequence can be rewound there; recorded
        in the store (a later job given None keeps by the recorded N); 0: none from now on;
        None: the recorded N, else none.
    initial_state: state files a sequence without a commit starts from, as (seq_id, path)
        pairs; seq_id None: every sequence not named (initial_states.py).
    """

    checkpoint_dir: str | None = None
    checkpoint_every: int = 16
    checkpoint_keep: int = 2
    resume: bool = False
    max_buffered_chunks: int | None = None
    idle_timeout: float = 300.0
    emit: str = "tokens"
    progress_every_s: float | None = None
    restore_fallback: bool = False
    output_dir: str | None = None
    max_chunk_tokens: int = MAX_CHUNK_TOKENS
    block_tokens: int = 8192
    total_tokens: int | None = None
    keep_every_tokens: int | None = None
    initial_state: tuple[tuple[str | None, str], ...] = ()

    def __post_init__(self) -> None:
        if self.emit not in EMIT_MODES:
            msg = f"emit must be one of {EMIT_MODES}, got {self.emit!r}"
            raise ValueError(msg)
        if self.checkpoint_every < 1:
            msg = f"checkpoint_every must be >= 1, got {self.checkpoint_every}"
            raise ValueError(msg)
        if self.max_buffered_chunks is not None and self.max_buffered_chunks < 0:
            msg = f"max_buffered_chunks must be >= 0 or None, got {self.max_buffered_chunks}"
            raise ValueError(msg)
        if self.resume and not self.checkpoint_dir:
            msg = "resume=True needs a checkpoint_dir to resume from"
            raise ValueError(msg)
        if self.output_dir and not self.checkpoint_dir:
            msg = "output_dir (outputs written with the commits) needs a checkpoint_dir"
            raise ValueError(msg)
        if self.max_chunk_tokens < 1 or self.block_tokens < 1:
            msg = (
                "max_chunk_tokens and block_tokens must be >= 1, got "
                f"{self.max_chunk_tokens} and {self.block_tokens}"
            )
            raise ValueError(msg)
        if self.keep_every_tokens is not None and self.keep_every_tokens < 0:
            msg = f"keep_every_tokens must be >= 0, got {self.keep_every_tokens}"
            raise ValueError(msg)
        if self.initial_state and self.emit == "sequence":
            raise ValueError(NO_SEQUENCE_EMIT)
        object.__setattr__(
            self, "initial_state", tuple((k, str(v)) for k, v in dict(self.initial_state).items())
        )
        # Plain Python values from here on (a NumPy integer or a bool-ish flag is converted once).
        for name, kind in (
            ("checkpoint_every", int),
            ("checkpoint_keep", int),
            ("resume", bool),
            ("idle_timeout", float),
            ("restore_fallback", bool),
            ("max_chunk_tokens", int),
            ("block_tokens", int),
        ):
            object.__setattr__(self, name, kind(getattr(self, name)))
        if self.keep_every_tokens is not None:
            object.__setattr__(self, "keep_every_tokens", int(self.keep_every_tokens))

    @classmethod
    def with_options(
        cls, where: str, base: StageConfig | None, options: Mapping[str, Any]
    ) -> StageConfig:
        """``base`` (or the defaults) with ``options`` set: the keyword arguments a transform
        received beside its own.  An unknown name is a TypeError naming ``where``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            msg = (
                f"{where}() got an unexpected keyword argument {unknown[0]!r} (the stage's "
                f"options are {', '.join(sorted(known))})"
            )
            raise TypeError(msg)
        return dataclasses.replace(base or cls(), **options)
