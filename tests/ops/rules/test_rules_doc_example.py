"""docs/rules.md's update-rule example runs as written and continues the sequence across calls."""

import re
from pathlib import Path

import numpy as np
from linstream.ops.additive.naive import rule_recurrent

RULES_DOC = Path(__file__).resolve().parents[3] / "docs" / "rules.md"


def test_the_rules_example_runs_and_matches_one_call():
    blocks = re.findall(r"```python\n(.*?)```", RULES_DOC.read_text(), flags=re.S)
    block = next(b for b in blocks if 'rule="gated_delta"' in b and "log_alpha=" in b)
    scope: dict = {}
    exec(compile(block, str(RULES_DOC), "exec"), scope)
    q, k, v = scope["q"], scope["k"], scope["v"]
    assert scope["out"].shape == (1048, 8, 64) and scope["out"].dtype == np.float32
    # the last tokens against the float64 reference, on one head to keep it quick
    ref, _ = rule_recurrent(
        q[:, :1], k[:, :1], v[:, :1], rule="gated_delta",
        log_alpha=scope["log_alpha"][:, :1], beta=scope["beta"][:, :1],
    )  # fmt: skip
    err = np.max(np.abs(scope["out"][-50:, 0] - ref[-50:, 0]))
    assert err <= 4 * (64 + 64 + 2048 / 64) * 2.0**-23 * max(1.0, float(np.max(np.abs(ref))))
