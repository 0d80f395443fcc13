"""The stateful stage: per sequence, order its chunks, carry its state, commit it with its outputs.

    transforms      the public PTransforms, CausalLinearAttention and EmbedSequences
    config          StageConfig, the stage's options (one frozen value, checked once)
    sequence_stage  SequenceStage, one sequence's life: validate, restore, drop / buffer /
                    dead-letter / apply in order, commit, go idle (a plain class, no runner)
    dofn            SequenceDoFn, the Beam adapter over it: state specs, timer, outputs
    cells           the key's state as the stage sees it: one packed cell and two bags
    records         what the cell holds beside the state: the meta record, the buffer's index,
                    the window of applied chunks' digests (digests: the window and a chunk's
                    digest, without Beam, shared with the one-line API)
    applier         one chunk through a step, in bounded blocks, with refusals
    counters        the stage's counters (Beam metrics under `linstream`, injectable)
    steps           the per-chunk functions: raw attention over q/k/v, or the embedding model
    rule_spec       the update rule of CausalLinearAttention and its per-token inputs
    commits         restoring from the checkpoint store and committing to it
    spans           the output span a commit finalizes (results written as part of the commit)
    progress        the progress line

Nothing here imports `linstream.pipeline.io` or `linstream.pipeline.app`.
"""
