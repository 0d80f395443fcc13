"""Cases for the additive rule's CuPy path, shared by its CPU tests (the array code and the CUDA
kernels on the emulator: tests/ops/additive/test_cupy_xp.py, tests/ops/test_cuda_emu.py) and its
device tests (tests/ops/additive/test_cupy_gpu.py): random inputs in float32, float64 or
bfloat16 bits, a run over a split into calls with the state carried, and the comparison with
the float64 oracle (per-token relative error; the state against its own scale).

TOL, per-token relative error: an output is a ratio of sums of at most F + C products (the
feature dot with the carried state, the in-chunk terms), each rounding by u relative to the
terms, which the positive maps and denominators kept away from zero make comparable to the
result: (F + C)·u ≈ 1.5e-5 for F, C ≤ 128 in float32 (u = 6e-8), given 2e-5; bfloat16 inputs
are exact in float32, so the same; float64, 1e-10, far above (F + C)·u ≈ 3e-14.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from linstream.ops.additive.cupy import scan_causal
from linstream.ops.additive.naive import causal_quadratic
from linstream.ops.attention_state import AttentionState
from linstream.ops.feature_maps import FeatureMap, get_feature_map

from helpers.bf16 import bf16_round

__all__ = ["FEATURE_MAPS", "TOL", "SignSplit", "assert_matches_oracle", "make_case", "run_split",
           "scan_fn", "split_points"]  # fmt: skip


class SignSplit(FeatureMap):
    """Test-only map with F = 2·d_k and no fused kernel: [relu(x), relu(-x)] + 0.1, and a
    query map that differs from the key map."""

    name = "test-sign-split"

    def out_dim(self, d_in: int) -> int:
        return 2 * d_in

    def __call__(self, x: Any, xp: Any = np) -> Any:
        return xp.concatenate([xp.maximum(x, 0), xp.maximum(-x, 0)], axis=-1) + 0.1

    def query(self, x: Any, xp: Any = np) -> Any:
        """Queries rescaled per token (as FAVOR+ may): checks that q goes through `query`."""
        y = self(x, xp=xp)
        return y * (1.0 + xp.abs(x).sum(axis=-1, keepdims=True))


FEATURE_MAPS = {
    "elu+1": get_feature_map("elu+1"),
    "relu": get_feature_map("relu"),
    "identity": get_feature_map("identity"),
    "sign-split": SignSplit(),
}


def make_case(
    seed: int, t: int, h: int, dk: int, dv: int, fmap: str, in_dtype: str
) -> dict[str, Any]:
    """Random q/k/v and a random starting state; `exact` holds the values the oracle sees."""
    rng = np.random.default_rng(seed)
    fm = FEATURE_MAPS[fmap]
    if fmap in ("identity", "relu"):  # keep every denominator well away from zero
        q = rng.uniform(0.1, 1.0, (t, h, dk))
        k = rng.uniform(0.1, 1.0, (t, h, dk))
    else:
        q, k = rng.standard_normal((t, h, dk)), rng.standard_normal((t, h, dk))
    v = rng.standard_normal((t, h, dv))
    f = fm.out_dim(dk)
    n0 = int(rng.integers(0, 50))  # tokens "seen" before: a state from a plausible prefix
    s0 = AttentionState(rng.uniform(-0.5, 0.5, (h, f, dv)) * n0, rng.uniform(0.5, 1.0, (h, f)) * n0)
    arrays: dict[str, Any] = {}
    exact: dict[str, np.ndarray] = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        if in_dtype == "bfloat16":
            bits, val = bf16_round(x)
            arrays[name], exact[name] = bits, val.astype(np.float64)
        else:
            arrays[name] = x.astype(in_dtype)
            exact[name] = arrays[name].astype(np.float64)
    return {"arrays": arrays, "exact": exact, "state": s0, "fm": fm, "rng": rng}


def split_points(rng: np.random.Generator, t: int, n_splits: int) -> list[int]:
    cuts = sorted(set(rng.integers(0, t + 1, n_splits).tolist()))
    return [0, *cuts, t]


def run_split(fn: Any, case: dict[str, Any], bounds: list[int]) -> tuple[np.ndarray, Any]:
    """Run fn(q, k, v, state) -> (out, state) chunk by chunk over `bounds`, carrying the state."""
    a = case["arrays"]
    state = case["state"]
    outs = []
    for s, e in itertools.pairwise(bounds):
        if e == s:
            continue
        out, state = fn(a["q"][s:e], a["k"][s:e], a["v"][s:e], state)
        outs.append(np.asarray(out, dtype=np.float64))
    return np.concatenate(outs, axis=0), state


def assert_matches_oracle(
    case: dict[str, Any], out: np.ndarray, state: Any, *, eps: float, tol: float
) -> None:
    """Per-token relative norm error of out, and the carried state, against the float64 oracle."""
    ex = case["exact"]
    ref, ref_state = causal_quadratic(
        ex["q"], ex["k"], ex["v"], case["state"], feature_map=case["fm"], eps=eps
    )
    assert out.shape == ref.shape
    err = np.linalg.norm(out - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-2)
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= tol, f"per-token error {err.max():.3g} > {tol} at (t, h) = {worst}"
    assert state.S.dtype == case["state"].S.dtype
    s_scale = max(1.0, float(np.abs(ref_state.S).max()))
    z_scale = max(1.0, float(np.abs(ref_state.z).max()))
    np.testing.assert_allclose(np.asarray(state.S), ref_state.S, rtol=0, atol=tol * s_scale)
    np.testing.assert_allclose(np.asarray(state.z), ref_state.z, rtol=0, atol=tol * z_scale)


TOL = {"float32": 2e-5, "bfloat16": 2e-5, "float64": 1e-10}


def scan_fn(kernels: Any, fm: FeatureMap, in_dtype: str, c: int, eps: float) -> Any:
    cdt = np.float64 if in_dtype == "float64" else np.float32

    def fn(q: Any, k: Any, v: Any, state: AttentionState) -> Any:
        kinds = (in_dtype, in_dtype, in_dtype)
        return scan_causal(
            q,
            k,
            v,
            state,
            feature_map=fm,
            eps=eps,
            chunk_size=c,
            dtype=cdt,
            xp=np,
            kernels=kernels,
            kinds=kinds,
        )

    return fn
