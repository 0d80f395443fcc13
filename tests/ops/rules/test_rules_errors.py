"""Bad rule parameters are refused with one message saying what was expected and what came."""

from __future__ import annotations

import numpy as np
import pytest
from linstream.ops import causal_linear_attention

T, H = 6, 2
RNG = np.random.default_rng(0)
Q, K, V = (RNG.standard_normal((T, H, 3)) for _ in range(3))
GOOD = {"log_alpha": np.full((T, H), -0.1), "beta": np.full((T, H), 0.5), "gamma": [0.9, 0.8]}


@pytest.mark.parametrize(
    ("kw", "exc", "message"),
    [
        ({"rule": "nope"}, ValueError, r"unknown rule 'nope'; expected one of \['additive'"),
        ({"rule": "decay"}, ValueError, r"rule 'decay' needs gamma \(a number or an array \[H\]"),
        (
            {"rule": "gated"},
            ValueError,
            r"rule 'gated' needs log_alpha \(an array \[T, H\] = \[6, 2\]",
        ),
        (
            {"rule": "delta"},
            ValueError,
            r"rule 'delta' needs beta \(an array \[T, H\] = \[6, 2\] in",
        ),
        ({"rule": "gated_delta", "beta": GOOD["beta"]}, ValueError, "needs log_alpha"),
        (
            {"rule": "decay", "gamma": [0.9, 0.8, 0.7]},
            ValueError,
            r"gamma must be a number or an array of shape \[H\] = \[2\], got shape \(3,\)",
        ),
        (
            {"rule": "decay", "gamma": 1.0},
            ValueError,
            r"gamma must lie in \(0, 1\).*got 1.0 for head 0",
        ),
        ({"rule": "decay", "gamma": [0.5, 0.0]}, ValueError, "got 0.0 for head 1"),
        ({"rule": "decay", "gamma": "0.5"}, TypeError, "gamma must be a real number"),
        (
            {"rule": "gated", "log_alpha": np.zeros((T, H + 1))},
            ValueError,
            r"log_alpha must have shape \[T, H\] = \[6, 2\].*got \(6, 3\)",
        ),
        (
            {"rule": "gated", "log_alpha": np.full((T, H), 0.1)},
            ValueError,
            r"log_alpha must be finite and <= 0 .*token 0, head 0: 0.1",
        ),
        (
            {"rule": "gated", "log_alpha": np.where(np.eye(T, H) > 0, np.nan, -1.0)},
            ValueError,
            "log_alpha must be finite",
        ),
        (
            {"rule": "delta", "beta": np.zeros((T, H))},
            ValueError,
            r"beta must lie in \(0, 1\] for every token and head, got token 0, head 0: 0.0",
        ),
        ({"rule": "delta", "beta": np.full((T, H), 1.5)}, ValueError, "1.5"),
        ({"rule": "delta", "beta": np.ones(T)}, ValueError, r"beta must have shape \[T, H\]"),
        (
            {"rule": "additive", "gamma": 0.5},
            ValueError,
            r"gamma is a parameter of rule\(s\) \['decay'\], not of rule 'additive'",
        ),
        (
            {"rule": "delta", "beta": GOOD["beta"], "log_alpha": GOOD["log_alpha"]},
            ValueError,
            "log_alpha is a parameter of rule",
        ),
        ({"rule": "additive", "normalize": False}, ValueError, "normalize=False is for rules"),
        (
            {"rule": "decay", "gamma": 0.5, "normalize": 1},
            TypeError,
            "normalize must be True or False",
        ),
        (
            {"rule": "decay", "gamma": 0.5, "backend": "numpy"},
            ValueError,
            r"rule 'decay' runs on the Numba CPU kernel only: expected backend 'auto' or 'numba', "
            r"got 'numpy'",
        ),
    ],
    ids=lambda x: str(x)[:40] if not isinstance(x, dict) else "-".join(f"{k}" for k in x),
)
def test_bad_parameters_say_what_was_expected_and_what_came(kw, exc, message):
    with pytest.raises(exc, match=message):
        causal_linear_attention(Q, K, V, **kw)


def test_empty_chunk_keeps_the_state():
    out, st = causal_linear_attention(Q[:0], K[:0], V[:0], rule="gated", log_alpha=np.zeros((0, H)))
    assert out.shape == (0, H, 3) and np.all(st.S == 0)
