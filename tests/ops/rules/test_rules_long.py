"""Precision of every rule over a long stream: 2^24 tokens of one head against a float64 oracle.

Slow (minutes): `pytest -m slow -s tests/ops/rules/test_rules_long.py`.  The stream is fed
in segments of 2^20 tokens with the state carried, as a job would.  The oracle is a token-by-token
float64 recurrence compiled here (independent of the chunk kernels).  Inputs as in
test_precision_long.py: q ~ N(0, 0.5²), k ~ N(0, 0.1²) (φ(k) = elu(k)+1 ≈ 1, so the additive z
would grow by ≈1 per token), v ~ 1 + N(0, 0.5²); float32 inputs, d_k = d_v = 16, C = 64.
Gates: decay γ = 0.999; gated and gated_delta log α ~ -U(0.0002, 0.002) (windows of ~1000 tokens);
β ~ U(0.1, 0.9).  Error per token: ‖o_t − ref_t‖ / max(‖ref_t‖, 1e-3).

Bound asserted (derived as in test_rules_splits.py, with the window W = 1/(1 − max α) standing in
for T because older rounding is decayed away): 4·(F + C + W/C)·(u_c + u_s)·M with M the largest
output, state or value seen, and no growth: the last segment's worst error is within 4× of the
first segment's (the additive rule's float32 state fails exactly this, see PERF-NOTES).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from linstream.ops import causal_linear_attention
from linstream.ops.rules import unit_keys

SEGMENT = 2**20
TOTAL = 2**24
D = 16
C = 64
STATE_DTYPES = {"f64 state": np.float64, "f32 state": np.float32}


@numba.njit(cache=True)
def _oracle(q, k, v, la, beta, s, z, out, delta, eps):  # pragma: no cover - jitted
    """Token by token in float64: q, k [T, F] features (unit keys for delta rules)."""
    t, f = q.shape
    dv = v.shape[1]
    kts = np.empty(dv)
    for i in range(t):
        a = np.exp(la[i])
        if delta:
            for r in range(dv):
                acc = 0.0
                for p in range(f):
                    acc += k[i, p] * s[p, r]
                kts[r] = acc
            for p in range(f):
                for r in range(dv):
                    s[p, r] = (
                        a * (s[p, r] - beta[i] * k[i, p] * kts[r]) + beta[i] * k[i, p] * v[i, r]
                    )
            for r in range(dv):
                acc = 0.0
                for p in range(f):
                    acc += q[i, p] * s[p, r]
                out[i, r] = acc
        else:
            den = 0.0
            for p in range(f):
                z[p] = a * z[p] + k[i, p]
                den += q[i, p] * z[p]
                for r in range(dv):
                    s[p, r] = a * s[p, r] + k[i, p] * v[i, r]
            for r in range(dv):
                acc = 0.0
                for p in range(f):
                    acc += q[i, p] * s[p, r]
                out[i, r] = acc / (den + eps)


def _elu1(x):
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def run_long(rule, total=TOTAL, seed=0):
    """Returns {state name: [(tokens so far, worst error in segment)]}, final state errors, M."""
    rng = np.random.default_rng(seed)
    s = np.zeros((D, D))
    z = np.zeros(D)
    states = dict.fromkeys(STATE_DTYPES)
    rows: dict[str, list[tuple[int, float]]] = {n: [] for n in STATE_DTYPES}
    mag = 0.0
    for seg in range(total // SEGMENT):
        q = (rng.standard_normal((SEGMENT, 1, D), dtype=np.float32) * 0.5).astype(np.float32)
        k = (rng.standard_normal((SEGMENT, 1, D), dtype=np.float32) * 0.1).astype(np.float32)
        v = (1 + 0.5 * rng.standard_normal((SEGMENT, 1, D), dtype=np.float32)).astype(np.float32)
        kw: dict = {}
        la = np.zeros(SEGMENT)
        beta = np.ones(SEGMENT)
        if rule == "decay":
            kw["gamma"] = 0.999
            la[:] = np.log(0.999)
        if rule in ("gated", "gated_delta"):
            la = -rng.uniform(0.0002, 0.002, size=SEGMENT)
            kw["log_alpha"] = la[:, None]
        if rule in ("delta", "gated_delta"):
            beta = rng.uniform(0.1, 0.9, size=SEGMENT)
            kw["beta"] = beta[:, None]
        delta = rule in ("delta", "gated_delta")
        qf = _elu1(q[:, 0].astype(np.float64))
        kf = _elu1(k[:, 0].astype(np.float64))
        if delta:
            kf = unit_keys(kf)
        ref = np.empty((SEGMENT, D))
        _oracle(qf, kf, v[:, 0].astype(np.float64), la, beta, s, z, ref, delta, 1e-6)
        ref_norm = np.maximum(np.linalg.norm(ref, axis=-1), 1e-3)
        mag = max(mag, float(np.max(np.abs(ref))), float(np.max(np.abs(s))), float(np.max(v)))
        for name, sdt in STATE_DTYPES.items():
            out, states[name] = causal_linear_attention(
                q, k, v, states[name], rule=rule, chunk_size=C, state_dtype=sdt, **kw
            )
            err = np.linalg.norm(out[:, 0].astype(np.float64) - ref, axis=-1) / ref_norm
            rows[name].append(((seg + 1) * SEGMENT, float(err.max())))
    final = {n: float(np.max(np.abs(st.S[0] - s)) / np.max(np.abs(s))) for n, st in states.items()}
    return rows, final, mag


def bound(rule, sdt, mag):
    window = {"decay": 1 / (1 - 0.999), "gated": 1 / 0.0002, "gated_delta": 1 / 0.0002}
    w = window.get(rule, TOTAL)
    u = (float(np.finfo(np.float32).eps) + float(np.finfo(sdt).eps)) / 2
    return 4 * (D + C + w / C) * u * mag


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["decay", "gated", "delta", "gated_delta"])
def test_long_stream_error_stays_bounded(rule):
    rows, final, mag = run_long(rule)
    for name, sdt in STATE_DTYPES.items():
        errs = [e for _, e in rows[name]]
        print(f"{rule:12s} {name}: worst per-token error first segment {errs[0]:.2e}, "
              f"last {errs[-1]:.2e}, overall {max(errs):.2e}; state rel. error at 2^24 "
              f"{final[name]:.2e}")  # fmt: skip
        assert max(errs) <= bound(rule, sdt, mag), (name, max(errs), bound(rule, sdt, mag))
        assert errs[-1] <= 4 * errs[0] + 1e-12, (name, errs)
