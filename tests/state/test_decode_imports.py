"""Reading a checkpoint imports no pandas and no Numba: pyarrow's ``to_numpy`` would import
pandas, and the kernels' package Numba; either import was most of the time ``linstream
checkpoint inspect`` takes on a small store."""

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers.store_faults import random_state
from linstream.state import CheckpointStore, encode_state

FP = "f" * 64

_CHILD = """
import json, sys
from linstream.state import CheckpointStore, decode_state
from linstream.pipeline.app.checkpoint_cli import main
path, root, seq_id = sys.argv[1:4]
with open(path, "rb") as f:
    st = decode_state(f.read())
heavy = lambda: sorted({"pandas", "numba"} & set(sys.modules))
after_decode = heavy()
head = CheckpointStore(root).head(seq_id, fingerprint=None)
after_restore = heavy()
code = main(["checkpoint", "inspect", root])
print(json.dumps({
    "decode": after_decode, "restore": after_restore, "inspect": heavy(),
    "code": code, "S": st.S.ravel().tolist(), "head_position": head.state.position,
}))
"""


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_decoding_and_inspecting_a_state_import_no_pandas_and_no_numba(tmp_path, dtype):
    st = random_state(3, (2, 3, 4, 5), dtype=dtype)
    path = tmp_path / "state.arrow"
    path.write_bytes(encode_state(st))
    store = CheckpointStore(str(tmp_path / "store"))
    assert store.commit(st) == "committed"
    store.close()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path / "store"), st.seq_id],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["decode"], got["restore"], got["inspect"]) == ([], [], [])
    assert got["code"] == 0
    assert got["head_position"] == st.position
    # the child decoded the very values that were encoded (exact, at the state's dtype)
    np.testing.assert_array_equal(np.asarray(got["S"], dtype=dtype), st.S.ravel())
