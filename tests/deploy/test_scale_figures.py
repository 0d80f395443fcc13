"""deploy/README.md's scale table matches the built-in model and the state codec of today."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[2] / "deploy" / "README.md"


def _row(name: str) -> list[int]:
    for line in README.read_text().splitlines():
        if line.startswith(f"| `{name}` |"):
            return [int(n.replace(",", "")) for n in re.findall(r"([\d,]{5,}) B", line)]
    pytest.fail(f"deploy/README.md has no scale row for {name}")


def test_builtin_model_state_and_commit_bytes(tmp_path: Path) -> None:
    try:
        from linstream.ops import load_model
    except ImportError:  # the model runtime (issue 5) exports it from linstream.ops
        from linstream.ops.model.runtime import load_model
    from linstream.state import CheckpointStore, SequenceState, encode_state

    model = load_model("builtin:default")
    layers, heads, f, dv = model.state_shape
    raw, encoded, per_commit = _row("builtin:default")
    assert raw == layers * heads * (f * dv + f) * 8

    rng = np.random.default_rng(0)
    st = SequenceState(
        "seq-000001",
        123456,
        61,
        rng.random((layers, heads, f, dv)),
        rng.random((layers, heads, f)),
        model.fingerprint,
    )
    size = len(encode_state(st))
    CheckpointStore(str(tmp_path), keep=2).commit(st)
    written = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    # Within 2%: metadata may change by a few bytes; the table is about magnitudes.
    assert abs(size - encoded) <= 0.02 * encoded, (size, encoded)
    assert abs(written - per_commit) <= 0.02 * per_commit, (written, per_commit)
