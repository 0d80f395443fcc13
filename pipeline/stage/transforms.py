"""Public PTransforms: `CausalLinearAttention` (raw q/k/v) and `EmbedSequences` (a model).

Both key chunks by sequence id and run the one stateful stage (`SequenceStage`, applied through
its Beam adapter `SequenceDoFn`) with a different per-chunk step.  The stage's options are the
fields of `StageConfig`, passed as keyword arguments or whole (`stage=StageConfig(...)`).
Applying one returns the results; `.with_exception_handling()` makes it return
`(results, dead_letters)`, as RunInference does.
"""

from __future__ import annotations

import copy
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from linstream.pipeline.elements import Chunk, ChunkResult, DeadLetter, Rejected

from .config import DEFAULT_EMBED_EMIT, StageConfig
from .counters import NAMESPACE
from .dofn import DEAD_LETTERS, BeamMetrics, SequenceDoFn
from .sequence_stage import SequenceStage
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
    """The stateful stage with ``step``: `step` and `config` are public and read-only in use."""

    def __init__(self, step: ChunkStep, config: StageConfig) -> None:
        super().__init__()
        self.step = step
        self.config = config
        self._with_errors = False

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
        stage = SequenceDoFn(SequenceStage(self.step, self.config, metrics=BeamMetrics()))
        out = keyed | "OrderAndApply" >> beam.ParDo(stage).with_outputs(
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

    The stage's options are keyword arguments, the fields of `StageConfig` (checkpoint_dir,
    checkpoint_every, resume, max_buffered_chunks, output_dir, emit, idle_timeout, ...; see
    there), or a whole `stage=StageConfig(...)` that they override.
    """

    def __init__(
        self,
        feature_map: Any = "elu+1",
        eps: float = 1e-6,
        backend: str = "auto",
        *,
        state_dtype: Any = np.float64,
        rule: str = "additive",
        gamma: Any = None,
        normalize: bool = True,
        stage: StageConfig | None = None,
        **options: Any,
    ) -> None:
        step = RawAttentionStep(
            feature_map, eps, backend, state_dtype, rule=rule, gamma=gamma, normalize=normalize
        )
        super().__init__(step, StageConfig.with_options("CausalLinearAttention", stage, options))


class EmbedSequences(_SequenceTransform):
    """Embed chunks of token ids [T] or feature vectors [T, input_dim] with an embedding model.

    model: a `linstream.ops.load_model` spec ("builtin:default", a .safetensors path, a
    checkpoint folder in fla's format or its URL), loaded once per worker in `setup()`, or a
    loaded model.  Emits `ChunkResult`s whose output is the mean of the chunk's [T, d_model]
    float32 embeddings (emit="mean", the default, as in `linstream embed`), the embeddings
    themselves (emit="tokens"), the last one (emit="last"), or one mean per finished sequence
    (emit="sequence").  layer: a checkpoint folder's models only, the hidden state to emit (0 the
    embeddings .. L the final norm, the default; as fla's `output_hidden_states` numbers them).
    compute_dtype: how a model given by its spec is loaded (float32, the default; float64; or
    bfloat16, a checkpoint folder's models only: weights held in 16 bits, float32 outputs).
    The stage's options are those of `CausalLinearAttention` (the fields of `StageConfig`); a
    whole ``stage=`` keeps its own emit.  ``loaded``: the model already loaded from the spec
    ``model`` (it is then not loaded again where the pipeline is built).
    """

    def __init__(
        self,
        model: Any = "builtin:default",
        *,
        backend: str = "auto",
        state_dtype: Any = np.float64,
        layer: int | None = None,
        compute_dtype: Any = None,
        loaded: Any = None,
        stage: StageConfig | None = None,
        **options: Any,
    ) -> None:
        self._embed = EmbedStep(
            model, backend, state_dtype, layer=layer, compute_dtype=compute_dtype, preloaded=loaded
        )
        if stage is None and "emit" not in options:
            options = {**options, "emit": DEFAULT_EMBED_EMIT}
        super().__init__(self._embed, StageConfig.with_options("EmbedSequences", stage, options))

    @property
    def model(self) -> Any:
        """The model (loaded on this machine): ``model.config.d_model`` is the output width."""
        return self._embed.model
