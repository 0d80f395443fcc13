"""Why the update rules matter, measured: after 10^6 tokens of shared history, how far do two
different recent windows move the output?

    pytest tests/bench/test_bench_recency.py -m bench -s      (needs matplotlib; writes
                                                               docs/img/recency.png)

One head, d_k = d_v = 16, float32 inputs, elu+1.  A shared history of N = 10^6 tokens is run
once per rule; from its state two streams continue with different windows A and B of w tokens
(independent draws), and both end with the same query token.  The distance
‖y_A − y_B‖ / sqrt(d_v) of that last output (values are N(0, 1): 1 is the scale of one value)
says how much the recent window decides the read.  Rules: additive; decay γ = 0.999 (a window
of ~1000 tokens); gated_delta with log α = log 0.999 and β = 0.5.  Median over 8 pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from linstream.ops import causal_linear_attention

N = 10**6
D = 16
WINDOWS = [4, 16, 64, 256, 1024, 4096, 16384]
PAIRS = 8
PNG = Path(__file__).resolve().parents[2] / "docs" / "img" / "recency.png"
RULES = {
    "additive": lambda t: {},
    "decay γ=0.999": lambda t: {"rule": "decay", "gamma": 0.999},
    "gated_delta α=0.999, β=0.5": lambda t: {
        "rule": "gated_delta",
        "log_alpha": np.full((t, 1), np.log(0.999)),
        "beta": np.full((t, 1), 0.5),
    },
}


def _tokens(rng, t):
    q = (rng.standard_normal((t, 1, D)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((t, 1, D)) * 0.5).astype(np.float32)
    v = rng.standard_normal((t, 1, D)).astype(np.float32)
    return q, k, v


def recency(seed=0):
    """{rule: [median distance for each w in WINDOWS]}."""
    rng = np.random.default_rng(seed)
    history = []
    for _ in range(N // 2**17 + 1):
        history.append(_tokens(rng, min(2**17, N - 2**17 * len(history))))
    history = [h for h in history if len(h[0])]
    last_q = (rng.standard_normal((1, 1, D)) * 0.5).astype(np.float32)
    windows = {w: [(_tokens(rng, w), _tokens(rng, w)) for _ in range(PAIRS)] for w in WINDOWS}
    result = {}
    for name, params in RULES.items():
        state = None
        for q, k, v in history:
            _, state = causal_linear_attention(q, k, v, state, **params(len(q)))
        dists = []
        for w in WINDOWS:
            per = []
            for a, b in windows[w]:
                ys = []
                for q, k, v in (a, b):
                    qq = np.concatenate([q, last_q])
                    kk = np.concatenate([k, k[-1:]])
                    vv = np.concatenate([v, v[-1:]])
                    out, _ = causal_linear_attention(qq, kk, vv, state, **params(w + 1))
                    ys.append(out[-1, 0].astype(np.float64))
                ya, yb = ys
                per.append(float(np.linalg.norm(ya - yb) / np.sqrt(D)))
            dists.append(float(np.median(per)))
        result[name] = dists
    return result


@pytest.mark.bench
def test_bench_recency_plot():
    plt = pytest.importorskip("matplotlib.pyplot")
    result = recency()
    print(f"\nmedian distance of the last output, two windows of w tokens after N={N:,}")
    print("| rule | " + " | ".join(f"w={w}" for w in WINDOWS) + " |")
    print("|---|" + "---:|" * len(WINDOWS))
    for name, d in result.items():
        print(f"| {name} | " + " | ".join(f"{x:.3g}" for x in d) + " |")
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, d in result.items():
        ax.loglog(WINDOWS, d, marker="o", label=name)
    ax.set_xlabel("tokens w in the recent window")
    ax.set_ylabel("distance of the output, window A vs B")
    ax.set_title(f"After {N:,} tokens of shared history (one head, d=16)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    PNG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PNG)
    assert PNG.stat().st_size > 0
    add, dec = result["additive"], result["decay γ=0.999"]
    assert dec[-1] > 10 * add[-1]  # what the plot shows: the decaying read follows the window
