"""The embedding model: its configuration and weights, the streaming runtime, the PyTorch twin.

config        ModelConfig, a frozen dataclass that round-trips through JSON
weights       tensor names and shapes, the fixed initialization, the safetensors file format,
              the fingerprint
builtin       how the shipped `builtin:` models (builtin/*.safetensors) are made and checked
protocol      StreamingModel, what a runtime offers the pipeline (both runtimes satisfy it),
              and check_token_ids, the one check of a chunk's token ids
runtime       EmbeddingModel: one chunk at a time, carried per-layer state, no torch
layers        the runtime's layers against an array namespace (NumPy or CuPy)
kernels       the runtime's fused Numba passes (norms, residual adds, bias + activation)
blas, threads the runtime's thread layout (BLAS limits, row ranges on helper threads)
thread_limit  limit_threads(n): the kernels', BLAS's and the row split's threads bounded
device        the runtime on a CuPy device
twin          TorchEmbeddingModel, the same function in PyTorch (training, a reference);
              twin_rules holds the update rules in PyTorch.  Needs torch; nothing else here
              imports them.
fla           pretrained checkpoints in flash-linear-attention's format (GLA, RetNet, DeltaNet,
              Gated DeltaNet, HGRN2): their config, folder loader and streaming runtime
"""
