"""Worked examples of every update rule, small enough to check by hand (identity map, eps = 0).

Keys [1,0], [0,1], [1,0]; values [2,0], [0,3], [1,1]; every query [1,1] — the additive example
of the first article, now with decay, gates and the delta rule.  The hand computation is written
out above each expected value.  Tolerance: a few roundings of numbers below 10, 16·2^-53·10.
"""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops import AttentionState, causal_linear_attention
from linstream.ops.additive.naive import rule_recurrent

K = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])[:, None, :]
V = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])[:, None, :]
Q = np.ones((3, 1, 2))
TOL = 16 * 2.0**-53 * 10

CASES = {
    # decay γ = 1/2:
    #   S1 = [[2,0],[0,0]], z1 = [1,0];                      y1 = [2,0]/1 = [2, 0]
    #   S2 = S1/2 + [[0,0],[0,3]] = [[1,0],[0,3]], z2 = [1/2, 1];  y2 = [1,3]/(3/2) = [2/3, 2]
    #   S3 = S2/2 + [[1,1],[0,0]] = [[3/2,1],[0,3/2]], z3 = [5/4, 1/2]
    #                                               y3 = [3/2, 5/2]/(7/4) = [6/7, 10/7]
    "decay": (
        {"gamma": 0.5},
        [[2, 0], [2 / 3, 2], [6 / 7, 10 / 7]],
        [[1.5, 1.0], [0.0, 1.5]],
        [1.25, 0.5],
    ),
    # the same without the normalizer: y_t = φ(q_t)ᵀS_t = column sums of S_t
    "decay-unnormalized": (
        {"gamma": 0.5, "normalize": False},
        [[2, 0], [1, 3], [1.5, 2.5]],
        [[1.5, 1.0], [0.0, 1.5]],
        [1.25, 0.5],
    ),
    # gated α = [1, 1/2, 1/4]:
    #   S2 = [[1,0],[0,3]], z2 = [1/2, 1] as above; S3 = S2/4 + [[1,1],[0,0]] = [[5/4,1],[0,3/4]]
    #   z3 = [1/8 + 1, 1/4] = [9/8, 1/4]; y3 = [5/4, 7/4] / (11/8) = [10/11, 14/11]
    "gated": (
        {"log_alpha": np.log([[1.0], [0.5], [0.25]])},
        [[2, 0], [2 / 3, 2], [10 / 11, 14 / 11]],
        [[1.25, 1.0], [0.0, 0.75]],
        [1.125, 0.25],
    ),
    # delta β = [1, 1, 1/2] (keys already unit):
    #   S1 = k1 v1ᵀ = [[2,0],[0,0]]                                     y1 = S1ᵀq = [2, 0]
    #   S1ᵀk2 = [0,0];  S2 = S1 + k2 [0,3]ᵀ = [[2,0],[0,3]]              y2 = [2, 3]
    #   S2ᵀk3 = [2,0];  v3 - [2,0] = [-1,1];  S3 = S2 + ½ k3 [-1,1]ᵀ = [[3/2,1/2],[0,3]]
    #                                                                    y3 = [3/2, 7/2]
    "delta": (
        {"beta": np.array([[1.0], [1.0], [0.5]])},
        [[2, 0], [2, 3], [1.5, 3.5]],
        [[1.5, 0.5], [0.0, 3.0]],
        [0.0, 0.0],
    ),
    # gated delta α = [1, 1/2, 1/2], β = [1, 1, 1/2]:
    #   S1 = [[2,0],[0,0]]
    #   S2 = ½ (I - k2k2ᵀ) S1 + k2 [0,3]ᵀ = ½ [[2,0],[0,0]] + [[0,0],[0,3]] = [[1,0],[0,3]]
    #   S3 = ½ (I - ½ k3k3ᵀ) S2 + ½ k3 [1,1]ᵀ = ½ [[1/2,0],[0,3]] + [[1/2,1/2],[0,0]]
    #      = [[3/4,1/2],[0,3/2]]                                         y3 = [3/4, 2]
    "gated_delta": (
        {"log_alpha": np.log([[1.0], [0.5], [0.5]]), "beta": np.array([[1.0], [1.0], [0.5]])},
        [[2, 0], [1, 3], [0.75, 2.0]],
        [[0.75, 0.5], [0.0, 1.5]],
        [0.0, 0.0],
    ),
}


def _rule(name: str) -> str:
    return name.split("-")[0]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("chunk_size", [1, 2, 3])
def test_kernel_gives_the_hand_computed_outputs_and_state(name, chunk_size):
    kw, y, s, z = CASES[name]
    out, st = causal_linear_attention(
        Q, K, V, rule=_rule(name), feature_map="identity", eps=0.0, chunk_size=chunk_size, **kw
    )
    np.testing.assert_allclose(out[:, 0], y, rtol=0, atol=TOL)
    np.testing.assert_allclose(st.S[0], s, rtol=0, atol=TOL)
    np.testing.assert_allclose(st.z[0], z, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_reference_gives_the_hand_computed_outputs(name):
    kw, y, s, _ = CASES[name]
    out, st = rule_recurrent(Q, K, V, rule=_rule(name), feature_map="identity", eps=0.0, **kw)
    np.testing.assert_allclose(out[:, 0], y, rtol=0, atol=TOL)
    np.testing.assert_allclose(st.S[0], s, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_token_by_token_calls_carry_the_state(name):
    """Three calls of one token each, the state handed on: the same outputs."""
    kw, y, _, _ = CASES[name]
    st = AttentionState.zeros(1, 2, 2)
    outs = []
    for t in range(3):
        per = {a: (b[t : t + 1] if isinstance(b, np.ndarray) else b) for a, b in kw.items()}
        o, st = causal_linear_attention(
            Q[t : t + 1], K[t : t + 1], V[t : t + 1], st, rule=_rule(name),
            feature_map="identity", eps=0.0, **per,
        )  # fmt: skip
        outs.append(o[0, 0])
    np.testing.assert_allclose(outs, y, rtol=0, atol=TOL)


def test_delta_rule_with_beta_one_overwrites_the_key_slot():
    """β = 1 writes v exactly into the slot of a unit key: S3 = [[1,1],[0,3]], y3 = [1, 4]."""
    out, st = causal_linear_attention(
        Q, K, V, rule="delta", beta=np.ones((3, 1)), feature_map="identity", eps=0.0
    )
    np.testing.assert_allclose(st.S[0], [[1, 1], [0, 3]], rtol=0, atol=TOL)
    np.testing.assert_allclose(out[2, 0], [1, 4], rtol=0, atol=TOL)


def test_delta_rule_normalizes_keys():
    """A key [3, 4] acts as [0.6, 0.8]: S1 = ½·[0.6,0.8]ᵀ[1, 2]; y1 = S1ᵀ[1,1] = 0.7·[1, 2]."""
    k = np.array([[[3.0, 4.0]]])
    v = np.array([[[1.0, 2.0]]])
    out, st = causal_linear_attention(
        np.ones((1, 1, 2)), k, v, rule="delta", beta=np.full((1, 1), 0.5), feature_map="identity"
    )
    np.testing.assert_allclose(st.S[0], 0.5 * np.outer([0.6, 0.8], [1, 2]), rtol=0, atol=TOL)
    np.testing.assert_allclose(out[0, 0], [0.7, 1.4], rtol=0, atol=TOL)
