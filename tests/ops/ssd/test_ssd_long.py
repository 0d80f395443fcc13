"""Precision of the SSD kernel over a long stream: 2^15 tokens (2^20 with `-m slow`) fed in
calls of 2,048 tokens with the state carried, as a job feeds a model, against the float64
token-by-token reference (`linstream.ops.ssd.naive`).

Inputs: one group, 2 heads of head_dim 8, d_state 16; x ~ N(0, 1), B, C ~ N(0, 1/N); time steps
softplus(N(0, 0.3²) − 2) ≈ 0.13 and A = −(0.008, 0.004): decay windows W of ~1,000 and ~2,000
tokens, so the state sums ~W tokens and older rounding decays away.  Error per token: ‖y_t −
ref_t‖ / max(‖ref_t‖, 1e-3), worst per call.

Bounds (derived): every call's worst error is within 8 · e32 (e32: transformers' own float32
scan's worst relative error on the first call against its float64 run, the rounding of this
rule at float32 on these inputs; 8 as in test_ssd_kernel.py), and there is no growth: the last
call's worst error is within 4× the first's (a float32 sum without decay would grow as √T).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is a test extra (make test installs it)")

from helpers.mamba2_oracle import chunk_scan  # noqa: E402
from linstream.ops.ssd.naive import ssd_recurrent  # noqa: E402
from linstream.ops.ssd.numba import ssd_chunks  # noqa: E402

CALL = 2048
H, P, N = 2, 8, 16
SEED = 20261210


def inputs(total: int) -> dict:
    rng = np.random.default_rng(SEED)
    return dict(
        x=rng.standard_normal((total, H, P)),
        dt=0.3 * rng.standard_normal((total, H)),
        a=-np.array([0.008, 0.004]),
        b=rng.standard_normal((total, 1, N)) / np.sqrt(N),
        c=rng.standard_normal((total, 1, N)) / np.sqrt(N),
        d=np.ones(H),
        dt_bias=np.full(H, -2.0),
    )


def rel(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-token relative error over the heads' outputs."""
    num = np.linalg.norm((y - ref).reshape(len(ref), -1), axis=1)
    den = np.maximum(np.linalg.norm(ref.reshape(len(ref), -1), axis=1), 1e-3)
    return num / den


def run(total: int, state_dtype) -> None:
    kw = inputs(total)
    print(f"seed={SEED} tokens={total} state {np.dtype(state_dtype).name}")
    ref, _ = ssd_recurrent(
        kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"], kw["d"], dt_bias=kw["dt_bias"]
    )
    first = {k: (v[:CALL] if k in ("x", "dt", "b", "c") else v) for k, v in kw.items()}
    args = (first["x"], first["dt"], first["a"], first["b"], first["c"])
    y64, _ = chunk_scan(*args, d=first["d"], dt_bias=first["dt_bias"], dtype=torch.float64)
    y32, _ = chunk_scan(*args, d=first["d"], dt_bias=first["dt_bias"], dtype=torch.float32)
    e32 = float(rel(y32, y64).max())
    state = np.zeros((H, P, N), state_dtype)
    worst = []
    for s in range(0, total, CALL):
        sl = slice(s, s + CALL)
        y = ssd_chunks(
            kw["x"][sl].astype(np.float32),
            kw["dt"][sl],
            kw["a"],
            kw["b"][sl].astype(np.float32),
            kw["c"][sl].astype(np.float32),
            kw["d"],
            state,
            dt_bias=kw["dt_bias"],
        )
        worst.append(float(rel(y, ref[sl]).max()))
    print(
        f"worst error per call: first {worst[0]:.3g}, last {worst[-1]:.3g}, max {max(worst):.3g}; "
        f"transformers float32's own {e32:.3g}"
    )
    assert max(worst) <= 8 * e32
    assert worst[-1] <= 4 * worst[0]


@pytest.mark.parametrize("state_dtype", [np.float64, np.float32], ids=["state64", "state32"])
def test_long_stream_keeps_float32_precision(state_dtype):
    run(2**15, state_dtype)


@pytest.mark.slow
@pytest.mark.parametrize("state_dtype", [np.float64, np.float32], ids=["state64", "state32"])
def test_very_long_stream_keeps_float32_precision(state_dtype):
    run(2**20, state_dtype)
