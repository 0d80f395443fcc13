"""Public PTransforms: `CausalLinearAttention` (raw q/k/v) and `EmbedSequences` (a model).

Both key chunks by sequence id and run the one stateful stage (`core.SequenceDoFn`) with a
different per-chunk step.  Applying one returns the results; `.with_exception_handling()` makes it
return `(results, dead_letters)`, as RunInference does.
"""

from __future__ import annotations

import copy
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from linstream.pipeline.elements import Chunk, ChunkResult, DeadLetter, Rejected

from .dofn import DEAD_LETTERS, NAMESPACE, SequenceDoFn
from .steps import ChunkStep, EmbedStep, RawAttentionStep

__all__ = ["CausalLinearAttention", "EmbedSequences"]


def _key_by_seq(chunk: Chunk) -> tuple[str, Chunk]:
    return (str(chunk.seq_id), chunk)


class _SplitRejected(beam.DoFn):
    """Rows that are no chunk of any sequence (`Rejected` payloads: no usable seq_id, an
    unreadable file) go straight to the dead letters, never keyed as a sequence."""

    def process(self, chunk: Chunk) -> Any:
        if isinstance(chunk.data, Rejected):
            idx = chunk.index if isinstance(chunk.index, int) else None
            Metrics.counter(NAMESPACE, "dead_letters").inc()
            Metrics.counter(NAMESPACE, f"dead_letters.{chunk.data.reason}").inc()
            dead = DeadLetter(str(chunk.seq_id), idx, chunk.data.reason, chunk.data.description)
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, dead)
        else:
            yield chunk


class _SequenceTransform(beam.PTransform):
    def __init__(self, step: ChunkStep, **stage: Any) -> None:
        super().__init__()
        self._with_errors = False
        self._dofn = SequenceDoFn(step, **stage)

    def with_exception_handling(self) -> _SequenceTransform:
        """Return a copy that yields `(results, dead_letters)` when applied."""
        other = copy.copy(self)
        other._with_errors = True
        return other

    def expand(self, pcoll: Any) -> Any:
        split = pcoll | "SplitRejected" >> beam.ParDo(_SplitRejected()).with_outputs(
            DEAD_LETTERS, main="chunks"
        )
        split.chunks.element_type = Chunk
        split[DEAD_LETTERS].element_type = DeadLetter
        keyed = split.chunks | "KeyBySequence" >> beam.Map(_key_by_seq).with_output_types(
            tuple[str, Chunk]
        )
        out = keyed | "OrderAndApply" >> beam.ParDo(self._dofn).with_outputs(
            DEAD_LETTERS, main="results"
        )
        results = out.results
        dead = (out[DEAD_LETTERS], split[DEAD_LETTERS]) | "AllDeadLetters" >> beam.Flatten()
        results.element_type = ChunkResult
        dead.element_type = DeadLetter
        if self._with_errors:
            return results, dead
        return results


class CausalLinearAttention(_SequenceTransform):
    """Causal linear attention over chunks whose data is {"q", "k", "v"} ([T, H, d] arrays).

    Each sequence (by `Chunk.seq_id`) carries its state (S, z) from chunk to chunk; chunks may
    come in any order and more than once.  Emits one `ChunkResult` per applied chunk with
    output [T, H, d_v] (or [H, d_v] with emit="mean"|"last").

    rule: the state's update rule (docs/rules.md): "additive" (default), "decay" (gamma: a
        number or one per head, in (0, 1)), "gated", "delta" or "gated_delta".  The per-token
        inputs come in each chunk's data beside q/k/v: "log_alpha" [T, H] (log gates <= 0) for
        gated and gated_delta, "beta" [T, H] (in (0, 1]) for delta and gated_delta.  A chunk
        whose inputs are missing, misshaped, out of range or not finite (or that carries one
        the rule does not use) is dead-lettered.  The rule, gamma and normalize are part of
        the checkpoint fingerprint: a resume under other ones is refused (`restore_failed`).
    normalize: False drops the normalizer of "decay" and "gated" (refused for other rules).

    checkpoint_dir: a CheckpointStore root (local path or any fsspec/Beam URL) or None.
    checkpoint_every: commit after this many applied chunks (and always at the final chunk).
    resume: restore each sequence from the store the first time it is seen.
    max_buffered_chunks: how far ahead of the next chunk to apply a chunk may be buffered;
        farther ones are dead-lettered (`beyond_buffer`).  None (the default): no bound — early
        chunks wait in Beam state, and the stage reads them back in batches of bounded bytes.
        Set a bound for streaming jobs whose gaps may never close.
    output_dir: write each span of results as part of the checkpoint commit that covers it,
        under `<output_dir>/results/` (exactly once across crashes and resumes; needs
        checkpoint_dir).  Results are still emitted on the main output.
    total_tokens: the input's token count when known (the progress line's ETA).
    max_chunk_tokens: longer chunks are dead-lettered (`too_large`) before any work; chunks are
        computed in blocks of `block_tokens` tokens, so memory stays bounded.
    idle_timeout: event-time seconds after a sequence's last chunk before its Beam state is
        committed and cleared (in a batch job: at the end of the input).
    """

    def __init__(
        self,
        feature_map: Any = "elu+1",
        eps: float = 1e-6,
        backend: str = "auto",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 16,
        resume: bool = False,
        max_buffered_chunks: int | None = None,
        *,
        state_dtype: Any = np.float64,
        checkpoint_keep: int = 2,
        idle_timeout: float = 300.0,
        emit: str = "tokens",
        progress_every_s: float | None = None,
        restore_fallback: bool = False,
        output_dir: str | None = None,
        max_chunk_tokens: int = 1 << 20,
        total_tokens: int | None = None,
        rule: str = "additive",
        gamma: Any = None,
        normalize: bool = True,
    ) -> None:
        super().__init__(
            RawAttentionStep(
                feature_map,
                eps,
                backend,
                state_dtype,
                rule=rule,
                gamma=gamma,
                normalize=normalize,
            ),
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            checkpoint_keep=checkpoint_keep,
            resume=resume,
            max_buffered_chunks=max_buffered_chunks,
            idle_timeout=idle_timeout,
            emit=emit,
            progress_every_s=progress_every_s,
            restore_fallback=restore_fallback,
            output_dir=output_dir,
            max_chunk_tokens=max_chunk_tokens,
            total_tokens=total_tokens,
        )


class EmbedSequences(_SequenceTransform):
    """Embed chunks of token ids [T] or feature vectors [T, input_dim] with an embedding model.

    model: a `linstream.ops.load_model` spec ("builtin:default", a .safetensors path), loaded once
    per worker in `setup()`, or a loaded model.  Emits `ChunkResult`s whose output is the
    [T, d_model] float32 embeddings (emit="tokens"), their mean, or the last one.  The other
    arguments are those of `CausalLinearAttention`.
    """

    def __init__(
        self,
        model: Any = "builtin:default",
        *,
        backend: str = "auto",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 16,
        resume: bool = False,
        max_buffered_chunks: int | None = None,
        state_dtype: Any = np.float64,
        checkpoint_keep: int = 2,
        idle_timeout: float = 300.0,
        emit: str = "tokens",
        progress_every_s: float | None = None,
        restore_fallback: bool = False,
        output_dir: str | None = None,
        max_chunk_tokens: int = 1 << 20,
        total_tokens: int | None = None,
    ) -> None:
        super().__init__(
            EmbedStep(model, backend, state_dtype),
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            checkpoint_keep=checkpoint_keep,
            resume=resume,
            max_buffered_chunks=max_buffered_chunks,
            idle_timeout=idle_timeout,
            emit=emit,
            progress_every_s=progress_every_s,
            restore_fallback=restore_fallback,
            output_dir=output_dir,
            max_chunk_tokens=max_chunk_tokens,
            total_tokens=total_tokens,
        )
