"""Precision over an unbounded sequence: 2^25 tokens of one head against a float64 oracle.

Slow (a minute or more): `make slow` or
`pytest -m slow -s tests/ops/additive/test_precision_long.py`.
The sequence is fed in segments of 2^20 tokens with the state carried, as a stream would be.
The oracle is `linstream.ops.additive.naive_numba.recurrent_float64` (token by token, all float64).
Inputs: q ~ N(0, 0.5²), k ~ N(0, 0.1²) so that φ(k) = elu(k)+1 ≈ 1 and z grows by ≈1 per
token (the case where a float32 z stalls near 2^24), v ~ 1 + N(0, 0.5²) so outputs stay near 1
and a relative error is meaningful.  Errors are per token: ‖o_t − ref_t‖ / ‖ref_t‖.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from linstream.ops import causal_linear_attention
from linstream.ops.additive.naive_numba import recurrent_float64

SEGMENT = 2**20
D_K = D_V = 4
# name: (state dtype, kernel chunk size)
CONFIGS = {
    "f64 state, C=64": (np.float64, 64),
    "f32 state, per token (C=1)": (np.float32, 1),
    "f32 state, C=64": (np.float32, 64),
    "f32 state, C=1024": (np.float32, 1024),
}


def run_long(total_tokens, configs=CONFIGS, seed=0):
    """Feed `total_tokens` float32 tokens through every config and the float64 oracle.

    Returns {name: [(tokens so far, worst per-token error in this segment, z rel. error)]}.
    """
    rng = np.random.default_rng(seed)
    ref_state = None
    states = dict.fromkeys(configs)
    rows: dict[str, list[tuple[int, float, float]]] = {name: [] for name in configs}
    for seg in range(total_tokens // SEGMENT):
        q = (rng.standard_normal((SEGMENT, 1, D_K), dtype=np.float32) * 0.5).astype(np.float32)
        k = (rng.standard_normal((SEGMENT, 1, D_K), dtype=np.float32) * 0.1).astype(np.float32)
        v = (1 + 0.5 * rng.standard_normal((SEGMENT, 1, D_V), dtype=np.float32)).astype(np.float32)
        ref, ref_state = recurrent_float64(q, k, v, ref_state)
        ref_norm = np.linalg.norm(ref, axis=-1)
        for name, (state_dtype, chunk) in configs.items():
            out, states[name] = causal_linear_attention(
                q, k, v, states[name], backend="numba", chunk_size=chunk, state_dtype=state_dtype
            )
            err = np.linalg.norm(out.astype(np.float64) - ref, axis=-1) / ref_norm
            z_err = float(np.max(np.abs(states[name].z - ref_state.z) / ref_state.z))
            rows[name].append(((seg + 1) * SEGMENT, float(err.max()), z_err))
    return rows


def report(rows):
    marks = [2**p for p in range(20, 26)]
    head = "| config | " + " | ".join(f"2^{int(np.log2(m))}" for m in marks) + " |"
    lines = [
        "worst per-token relative output error up to n tokens (z relative error at n)",
        head,
        "|---" * (len(marks) + 1) + "|",
    ]
    for name, data in rows.items():
        cells = []
        for m in marks:
            seen = [r for r in data if r[0] <= m]
            if len(seen) and seen[-1][0] == m:
                cells.append(f"{max(r[1] for r in seen):.1e} ({seen[-1][2]:.1e})")
            else:
                cells.append("-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@pytest.mark.slow
def test_float64_state_holds_1e6_over_2_to_25_tokens():
    t0 = time.perf_counter()
    rows = run_long(2**25)
    print()
    print(report(rows))
    print(f"({time.perf_counter() - t0:.0f} s)")
    worst64 = max(r[1] for r in rows["f64 state, C=64"])
    assert worst64 < 1e-6, worst64
    # a float32 state added per token has drifted far from the float64 one by the end
    assert rows["f32 state, per token (C=1)"][-1][2] > 1e-3
    assert rows["f32 state, per token (C=1)"][-1][1] > 100 * worst64


@pytest.mark.slow
@pytest.mark.parametrize(
    ("state_dtype", "chunk", "expected_z"),
    [(np.float32, 1, 2.0**24), (np.float32, 64, 2.0**25), (np.float64, 64, 2.0**25)],
    ids=["f32-per-token-stalls-at-2^24", "f32-per-chunk-C64", "f64"],
)
def test_float32_z_stalls_at_2_to_24_when_added_per_token(state_dtype, chunk, expected_z):
    """φ(k) = 1 exactly (identity map, k = 1): z must count tokens.  A float32 z that adds
    1 per token stops at 2^24 (2^24 + 1 rounds back to 2^24); adding C per chunk moves the
    stall to C·2^24 tokens (2^30 for C=64), and a float64 z counts to 2^53."""
    seg = 2**22
    ones = np.ones((seg, 1, 1), dtype=np.float32)
    state = None
    for _ in range(2**25 // seg):
        _, state = causal_linear_attention(
            ones,
            ones,
            ones,
            state,
            feature_map="identity",
            backend="numba",
            chunk_size=chunk,
            state_dtype=state_dtype,
        )
    assert state is not None
    assert float(state.z[0, 0]) == expected_z


def test_short_run_matches_oracle():
    """The same harness on one segment (fast): every config is accurate at 2^20 tokens."""
    rows = run_long(SEGMENT, {"f64": (np.float64, 64), "f32": (np.float32, 64)})
    assert rows["f64"][0][1] < 1e-6
    assert rows["f32"][0][1] < 1e-4
