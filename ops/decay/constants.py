"""The constants the gated rules' chunk kernels share, Numba and CUDA alike (no Numba import, so
that the CUDA wrappers load where Numba is not installed)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_RULE_CHUNK",
    "DEFAULT_VECTOR_CHUNK",
    "ERASING_GATE",
    "FLUSH_LOG_F32",
    "FLUSH_LOG_F64",
    "HOST_RULE_CHUNK",
    "LOG_GATE_FLOOR",
    "flush_log",
]

# Log gates below this are raised to it: e^-1000 is 0 in float64 (as is every e^x below -745.2),
# so no gate's float64 value changes, and sums of a few stay far from -inf.
LOG_GATE_FLOOR = -1000.0
# A gate below this keeps less than float64's resolution (e^-37 < 2^-53) of the state before it:
# such a token starts a chunk (`chunk_end`), so that the prefix sums of a chunk's gates after
# its first token stay small and their differences keep full precision.
ERASING_GATE = -37.0
# Chunk length of the vector-gated rule (tests/bench/test_bench_fla.py runs the kernel inside a
# model; 32 and 64 measured within 10% of each other there, 32 spends half the exponentials on A).
DEFAULT_VECTOR_CHUNK = 32
# Chunk length of the rule kernels (tests/bench/test_bench_rules.py measures 32 and 64).
DEFAULT_RULE_CHUNK = 64
# The Numba decay and delta kernels' chunk where the caller names none (the fla families: RetNet,
# DeltaNet, Gated DeltaNet; the CUDA wrappers default to DEFAULT_RULE_CHUNK).  A chunk's work is
# small BLAS products, fewer per token in shorter chunks: on the ~110M models' shapes (2,048
# tokens, 2 threads, BLAS at one) the delta kernel ran 1.1-1.2x faster than at 64 and RetNet's
# decay kernel 1.6x, the forwards 1.03x and 1.035x; their errors against float64 stayed 3-5e-7
# of the largest output at chunks of 8 to 64.
HOST_RULE_CHUNK = 32
# A decay factor e^x with x below this is taken as 0 by the Numba kernels (the vector-gated,
# the delta and Mamba-2's SSD rule), not computed: such a term is e^-60 ≈ 2^-86 of its undecayed
# size (float64: e^-700 ≈ 2^-1010), so leaving it out moves an output or a state by less than
# 2^-60 of its other terms, far below one rounding (2^-24; float64 2^-53); -60 rather than
# float32's own underflow (-87) keeps a factor's products with keys, steps and C·B (down to
# ~1e-11) normal too.  Computed, those
# factors and their products are subnormal numbers, which Intel's cores handle by a microcode
# assist per instruction: on a 2-vCPU Xeon with AMX, strong decays made the vector-gated and the
# delta kernels 17-24x slower, and Mamba-2 ~130M's SSD took 3.7 s of a 2,048-token float32 chunk
# (0.36 s without them); AMD's cores showed no such cost.
FLUSH_LOG_F32 = -60.0
FLUSH_LOG_F64 = -700.0


def flush_log(*dtypes: Any) -> float:
    """The flush of the narrowest of `dtypes` (the compute and the state dtype)."""
    narrow = any(np.dtype(d).itemsize < 8 for d in dtypes)
    return FLUSH_LOG_F32 if narrow else FLUSH_LOG_F64
