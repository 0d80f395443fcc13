"""The golden format-1 store (tests/state/golden/format-1, written by make_golden.py) must load
in every future version, bit for bit."""

import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from linstream.state import CheckpointStore, decode_state
from linstream.state.store.paths import encode_seq_dir

HERE = Path(__file__).resolve().parent
ROOT = HERE / "golden" / "format-1"
FINGERPRINT = "0123456789abcdef" * 4
# The committed files, pinned: regenerating them must be a deliberate change of this test.
FILES = {
    "golden/float64 ü": ("00000000000000001000.3a0881bd4c121223.arrow", "3a0881bd4c121223"),
    "golden-float32": ("00000000000000000064.5267a890ee8802cf.arrow", "5267a890ee8802cf"),
}
EXPECTED = {"golden/float64 ü": ("float64", 1000, 7), "golden-float32": ("float32", 64, 1)}


def _make_golden():
    spec = importlib.util.spec_from_file_location("make_golden", HERE / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seq_id", list(EXPECTED))
def test_golden_store_restores_bit_exact(seq_id):
    dtype, position, next_chunk = EXPECTED[seq_id]
    st = CheckpointStore(str(ROOT)).restore(seq_id, fingerprint=FINGERPRINT)
    assert st is not None
    assert (st.seq_id, st.position, st.next_chunk, str(st.dtype)) == (
        seq_id,
        position,
        next_chunk,
        dtype,
    )
    assert st.S.shape == (2, 3, 4, 5) and st.z.shape == (2, 3, 4)
    # literal values of the formula, independent of make_golden.py
    assert st.S[0, 0, 0, 0] == 1000.25
    assert st.S[1, 2, 3, 4] == -2234.25
    assert st.z[0, 0, 0] == 5011.25
    S, z = _make_golden().golden_values(dtype)
    assert st.S.tobytes() == S.tobytes() and st.z.tobytes() == z.tobytes()


@pytest.mark.parametrize("seq_id", list(FILES))
def test_golden_files_are_unchanged(seq_id):
    name, sha_prefix = FILES[seq_id]
    data = (ROOT / encode_seq_dir(seq_id) / name).read_bytes()
    assert hashlib.sha256(data).hexdigest().startswith(sha_prefix)
    assert decode_state(data, expected_fingerprint=FINGERPRINT).seq_id == seq_id


def test_golden_store_verifies_clean():
    store = CheckpointStore(str(ROOT))
    assert store.verify() == []
    assert store.sequences() == sorted(EXPECTED)
    assert store.orphans() == []


def test_generator_reproduces_the_golden_values():
    module = _make_golden()
    for seq_id in EXPECTED:
        st = module.golden_state(seq_id)
        back = CheckpointStore(str(ROOT)).restore(seq_id, fingerprint=FINGERPRINT)
        assert back == st
        assert np.isfinite(st.S).all()
