"""The constants the gated rules' chunk kernels share, Numba and CUDA alike (no Numba import, so
that the CUDA wrappers load where Numba is not installed)."""

from __future__ import annotations

__all__ = ["DEFAULT_RULE_CHUNK", "DEFAULT_VECTOR_CHUNK", "ERASING_GATE", "LOG_GATE_FLOOR"]

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
