"""The stateful stage: per sequence, order its chunks, carry its state, commit it with its outputs.

    sequence_stage  SequenceStage, one sequence's life: validate, restore, drop / buffer /
                    dead-letter / apply in order, commit, go idle (a plain class, no runner):
                    the sequence engine the Beam job and the one-line API both run
    transforms      the public PTransforms, CausalLinearAttention and EmbedSequences
    dofn            SequenceDoFn, the Beam adapter over the stage: state specs, timer, outputs,
                    Beam's metrics
    config          StageConfig, the stage's options (one frozen value, checked once)
    cells           the key's state as the stage sees it: one packed cell and two bags (Beam's,
                    or in memory)
    records         what the cell holds beside the state: the meta record, the buffer's index,
                    the window of applied chunks' digests (digests: the window and a chunk's
                    digest)
    applier         one chunk through a step, in bounded blocks, with refusals
    counters        the stage's counters (injected: Beam's metrics, or in memory)
    steps           the per-chunk functions: raw attention over q/k/v, or the embedding model
                    (any linstream.ops.model.protocol.StreamingModel)
    rule_spec       the update rule of CausalLinearAttention and its per-token inputs
    commits         restoring from the checkpoint store and committing to it
    spans/          the output spans a commit finalizes (results written as part of the commit)
    progress        the progress line

Only dofn and transforms import Beam (an import contract in pyproject.toml holds the rest to
it).  Nothing here imports `linstream.pipeline.io` or `linstream.pipeline.app`.
"""
