"""Write the golden format-1 checkpoint store under tests/state/golden/ (run once, commit it).

    .venv/bin/python tests/state/make_golden.py

Every future linstream must still restore these files (tests/state/test_golden.py).  The values
follow a closed formula, so the test checks them without trusting the files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
from linstream.state import FORMAT_VERSION, CheckpointStore, SequenceState

GOLDEN = Path(__file__).resolve().parent / "golden"
FINGERPRINT = "0123456789abcdef" * 4
SHAPE = (2, 3, 4, 5)  # L, H, F, d_v
SEQUENCES = {  # seq_id -> (dtype, position, next_chunk)
    "golden/float64 ü": ("float64", 1000, 7),
    "golden-float32": ("float32", 64, 1),
}


def golden_values(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """S[i,h,f,v] = (i+1)·1000 + h·100 + f·10 + v + 0.25, negated for odd f; z = Σ_v |S|."""
    i, h, f, v = np.indices(SHAPE)
    S = (i + 1) * 1000.0 + h * 100.0 + f * 10.0 + v + 0.25
    S = np.where(f % 2 == 1, -S, S).astype(dtype)
    z = np.abs(S).sum(axis=-1).astype(dtype)
    return S, z


def golden_state(seq_id: str) -> SequenceState:
    dtype, position, next_chunk = SEQUENCES[seq_id]
    S, z = golden_values(dtype)
    return SequenceState(seq_id, position, next_chunk, S, z, FINGERPRINT)


def main() -> int:
    assert FORMAT_VERSION == 1, "the golden store is format 1; write a new one for a new format"
    target = GOLDEN / "format-1"
    shutil.rmtree(target, ignore_errors=True)
    store = CheckpointStore(str(target))
    for seq_id in SEQUENCES:
        store.commit(golden_state(seq_id))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
