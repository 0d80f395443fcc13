"""The stateful stage: per sequence, order its chunks, carry its state, commit it with its outputs.

    transforms    the public PTransforms, CausalLinearAttention and EmbedSequences
    dofn          SequenceDoFn, the stateful DoFn they apply
    ordering      dropping, buffering and applying one sequence's chunks in order
    cells         the sequence's Beam state: one packed cell and two bags
    records       what the cell holds beside the state: the meta record, the buffer's index,
                  the window of applied chunks' digests
    applier       one chunk through a step, in bounded blocks, with refusals and counters
    steps         the per-chunk functions: raw attention over q/k/v, or the embedding model
    rule_spec     the update rule of CausalLinearAttention and its per-token inputs
    commits       restoring from the checkpoint store and committing to it
    spans         the output span a commit finalizes (results written as part of the commit)
    progress      the progress line

Nothing here imports `linstream.pipeline.io` or `linstream.pipeline.app`.
"""
