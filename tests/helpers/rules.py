"""The float64 reference of a whole sequence under an update rule, and its derived tolerance.

Tolerance (derived as in tests/ops/rules/test_rules_splits.py): an output is a sum of at most
n = F + C + (kernel chunks) products, each rounding by the compute dtype's unit roundoff u_c
(float32 inputs in these tests) relative to the magnitude M of its terms, plus the float64
state's u_s for the carried sums, so |Δy| ≤ 4·n·(u_c + u_s)·M, with M = max(|y_ref|, |S_ref|,
|v|) measured on the reference.  A sequence's kernel chunks are at most T/C plus one per
pipeline chunk (each pipeline chunk starts a kernel chunk).  F is d_k (elu+1, the default map).
"""

from __future__ import annotations

import numpy as np
from linstream.ops.additive.naive import rule_recurrent
from linstream.ops.rules import DEFAULT_RULE_CHUNK

#: The per-token inputs ([T, H]) a chunk carries, per rule.
PER_TOKEN = {"gated": ("log_alpha",), "delta": ("beta",), "gated_delta": ("log_alpha", "beta")}


def reference(rule: str, args: dict, data: dict, n_chunks: int) -> tuple[np.ndarray, float]:
    """(float64 token-by-token outputs of the whole sequence `data`, the tolerance of a job that
    sent it in `n_chunks` chunks with float32 q/k/v)."""
    kw = {n: data[n] for n in PER_TOKEN.get(rule, ())}
    if "gamma" in args:
        kw["gamma"] = np.asarray(args["gamma"])
    if "normalize" in args:
        kw["normalize"] = args["normalize"]
    q, k, v = (data[n].astype(np.float64) for n in "qkv")
    out, st = rule_recurrent(q, k, v, rule=rule, **kw)
    t, c, f = len(out), DEFAULT_RULE_CHUNK, q.shape[2]
    m = max(float(np.max(np.abs(out))), float(np.max(np.abs(st.S))), float(np.max(np.abs(v))))
    n = f + c + t // c + n_chunks + 1
    u_c, u_s = float(np.finfo(np.float32).eps) / 2, float(np.finfo(np.float64).eps) / 2
    return out, 4 * n * (u_c + u_s) * m
