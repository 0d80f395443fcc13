"""The rule kernels at the edges of their inputs, against the float64 token-by-token references.

- A gate of log α = -finfo(float64).max is finite and allowed (α = 0 in float64: the state is
  forgotten).  Two such tokens in one chunk once summed to -inf in the cumulative gate, and
  -inf - (-inf) made the state NaN for good, while the same tokens in separate calls did not.
- An Inf or NaN in k or v reaches the outputs from its own token on, as in the references
  (NaN and Inf propagate; the pipeline dead-letters them before), but never an earlier token's:
  the masked product of the chunk form once multiplied the masked zeros by the later Inf.

Tolerance as in test_rules_splits.py (derived there): 4·n·(u_compute + u_state)·M.
"""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops import causal_linear_attention
from linstream.ops.additive.naive import rule_recurrent
from linstream.ops.decay.vector_naive import vector_gated_recurrent
from linstream.ops.decay.vector_numba import vector_gated_chunks

from .test_rules_splits import tolerance
from .test_vector_gate import heads, run
from .test_vector_gate import tolerance as vector_tolerance

T, H, DK, DV, C = 24, 2, 5, 4, 8
DTYPES = [(np.float64, np.float64), (np.float32, np.float64), (np.float32, np.float32)]
DTYPE_IDS = ["f64-state64", "f32-state64", "f32-state32"]


def _qkv(seed, cdt):
    rng = np.random.default_rng(seed)
    print(f"seed={seed}")
    q, k, v = (rng.standard_normal((T, H, d)) for d in (DK, DK, DV))
    return q.astype(cdt), k.astype(cdt), v.astype(cdt), rng


def _params(rule, rng, log_alpha=None):
    kw: dict = {}
    if rule == "decay":
        kw["gamma"] = rng.uniform(0.5, 0.99, size=H)
    if rule in ("gated", "gated_delta"):
        kw["log_alpha"] = -rng.exponential(0.2, size=(T, H)) if log_alpha is None else log_alpha
    if rule in ("delta", "gated_delta"):
        kw["beta"] = rng.uniform(0.1, 1.0, size=(T, H))
    return kw


def _first(kw, n):
    return {name: (x[:n] if np.ndim(x) == 2 else x) for name, x in kw.items()}


@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_the_most_negative_finite_gate_at_two_tokens_of_a_chunk(rule, dtypes):
    cdt, sdt = dtypes
    q, k, v, rng = _qkv(1, cdt)
    log_alpha = -rng.exponential(0.2, size=(T, H))
    # head 0: two tokens of the second chunk (8..15), one token of the third
    log_alpha[[10, 13, 20], 0] = -np.finfo(np.float64).max
    kw = _params(rule, rng, log_alpha)
    ref, ref_state = rule_recurrent(q, k, v, rule=rule, **kw)
    assert np.isfinite(ref).all() and np.isfinite(ref_state.S).all()
    out, state = causal_linear_attention(q, k, v, rule=rule, chunk_size=C, state_dtype=sdt, **kw)
    tol = tolerance(ref, ref_state.S, v, T, C, DK, cdt, sdt)
    assert np.isfinite(out).all() and np.isfinite(state.S).all() and np.isfinite(state.z).all()
    assert float(np.max(np.abs(out - ref))) <= tol
    assert float(np.max(np.abs(state.S - ref_state.S))) <= tol
    # and the result does not depend on the split: one token per call gives the same
    s1, outs = None, []
    for i in range(T):
        o, s1 = causal_linear_attention(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], s1, rule=rule, state_dtype=sdt,
            **{n: (x[i : i + 1] if np.ndim(x) == 2 else x) for n, x in kw.items()},
        )  # fmt: skip
        outs.append(o)
    assert float(np.max(np.abs(np.concatenate(outs) - ref))) <= tol


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rule", ["decay", "gated", "gated-unnormalized", "delta", "gated_delta"])
def test_a_nonfinite_key_or_value_never_reaches_an_earlier_token(rule, dtypes, where, bad):
    cdt, sdt = dtypes
    name, normalize = rule.split("-")[0], "unnormalized" not in rule
    q, k, v, rng = _qkv(2, cdt)
    kw = _params(name, rng)
    if name in ("decay", "gated"):
        kw["normalize"] = normalize
    j = 13  # inside the second chunk (8..15), not its first token
    (k if where == "k" else v)[j, 1, 2] = bad  # head 1 only
    with np.errstate(invalid="ignore", over="ignore"):
        ref, ref_state = rule_recurrent(q, k, v, rule=name, **kw)
        out, _ = causal_linear_attention(q, k, v, rule=name, chunk_size=C, state_dtype=sdt, **kw)
    # the finite magnitudes: outputs before j and of head 0, the states before j and of head 0
    _, before = rule_recurrent(q[:j], k[:j], v[:j], rule=name, **_first(kw, j))
    outs = np.concatenate([ref[:j].ravel(), ref[:, 0].ravel()])
    states = np.concatenate([before.S.ravel(), ref_state.S[0].ravel()])
    tol = tolerance(outs, states, v[np.isfinite(v)], T, C, DK, cdt, sdt)
    # before token j, and on the other head, the outputs are the reference's
    assert np.isfinite(out[:j]).all(), np.argwhere(~np.isfinite(out[:j]))[:3].tolist()
    assert float(np.max(np.abs(out[:j] - ref[:j]))) <= tol
    assert float(np.max(np.abs(out[:, 0] - ref[:, 0]))) <= tol
    # from token j on, head 1 is non-finite where the reference is, and equal elsewhere
    np.testing.assert_array_equal(np.isfinite(out[j:, 1]), np.isfinite(ref[j:, 1]))
    both = np.isfinite(ref[j:, 1])
    if not (where == "k" and bad == -np.inf):  # elu+1 maps a key of -inf to a finite 0
        assert not both.all()
    assert float(np.max(np.abs(out[j:, 1][both] - ref[j:, 1][both]), initial=0.0)) <= tol


# -- the vector-gated kernel (a log gate per key dimension: GLA, HGRN2), against its float64
# reference; the same two edges, with the gate or the bad value in one key dimension of one head.
# Tolerance as in test_vector_gate.py (derived there).


def _vector(q, k, v, g, cdt, sdt, c=C):
    """The kernel over [T, H, ·] inputs from a zero state: out [T, H, d_v], the state."""
    s = np.zeros((H, DK, DV), dtype=sdt)
    out = vector_gated_chunks(*(heads(x, cdt) for x in (q, k, v, g)), s, chunk_size=c)
    return out.transpose(1, 0, 2), s


@pytest.mark.parametrize("gate", ["finfo", "-inf"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
def test_vector_gate_the_most_negative_gate_at_two_tokens_of_a_chunk(dtypes, gate):
    cdt, sdt = dtypes
    q, k, v, rng = _qkv(3, cdt)
    g = -rng.exponential(0.2, size=(T, H, DK))
    # head 0, key dimension 1: two tokens of the second chunk (8..15), one of the third; the
    # most negative finite gate of the compute dtype (-inf when cast to it: the caller's gates
    # are in the compute dtype), or -inf itself
    g[[10, 13, 20], 0, 1] = -np.finfo(cdt).max if gate == "finfo" else -np.inf
    g = g.astype(cdt)
    ref, ref_s = vector_gated_recurrent(q, k, v, log_gate=g)
    assert np.isfinite(ref).all() and np.isfinite(ref_s).all()
    with np.errstate(invalid="ignore", over="ignore"):
        out, s = _vector(q, k, v, g, cdt, sdt)
    tol = vector_tolerance(q, k, v, np.abs(ref_s).max(), T, C, cdt, sdt)
    assert np.isfinite(out).all() and np.isfinite(s).all()
    assert float(np.max(np.abs(out - ref))) <= tol
    assert float(np.max(np.abs(s - ref_s))) <= tol
    # and the result does not depend on the split: one token per call gives the same
    one, s1 = run(q, k, v, g, np.zeros((H, DK, DV)), list(range(T + 1)), C, cdt, sdt)
    assert float(np.max(np.abs(one - ref))) <= tol
    assert float(np.max(np.abs(s1 - ref_s))) <= tol


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=DTYPE_IDS)
def test_vector_gate_a_nonfinite_key_or_value_never_reaches_an_earlier_token(dtypes, where, bad):
    cdt, sdt = dtypes
    q, k, v, rng = _qkv(4, cdt)
    g = (-rng.exponential(0.2, size=(T, H, DK))).astype(cdt)
    j = 13  # inside the second chunk (8..15), not its first token
    (k if where == "k" else v)[j, 1, 2] = bad  # head 1 only
    with np.errstate(invalid="ignore", over="ignore"):
        ref, _ = vector_gated_recurrent(q, k, v, log_gate=g)
        out, _ = _vector(q, k, v, g, cdt, sdt)
    # the finite magnitudes: the largest finite entry of the reference's state at any token
    with np.errstate(invalid="ignore", over="ignore"):
        states = [
            vector_gated_recurrent(q[:i], k[:i], v[:i], log_gate=g[:i])[1] for i in range(1, T + 1)
        ]
    finite_s = max(float(np.abs(x[np.isfinite(x)]).max()) for x in states)
    tol = vector_tolerance(q, k[np.isfinite(k)][None, None], v[np.isfinite(v)][None, None],
                           finite_s, T, C, cdt, sdt)  # fmt: skip
    # before token j, and on the other head, the outputs are the reference's
    assert np.isfinite(out[:j]).all(), np.argwhere(~np.isfinite(out[:j]))[:3].tolist()
    assert float(np.max(np.abs(out[:j] - ref[:j]))) <= tol
    assert float(np.max(np.abs(out[:, 0] - ref[:, 0]))) <= tol
    # from token j on, head 1 is non-finite where the reference is, and equal elsewhere
    np.testing.assert_array_equal(np.isfinite(out[j:, 1]), np.isfinite(ref[j:, 1]))
    both = np.isfinite(ref[j:, 1])
    assert not both.all()
    assert float(np.max(np.abs(out[j:, 1][both] - ref[j:, 1][both]), initial=0.0)) <= tol
