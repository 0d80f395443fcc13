"""A manifest is untrusted input: a size it claims is never allocated before it is checked."""

import json

import pytest
from helpers.store_faults import random_state
from linstream.state import CheckpointStore, CorruptCheckpointError


@pytest.mark.parametrize("claimed", [1 << 40, 1 << 33], ids=["1TiB", "8GiB"])
def test_huge_claimed_size_is_a_named_error_not_an_allocation(tmp_path, claimed):
    store = CheckpointStore(str(tmp_path))
    st = random_state(0, seq_id="seq")
    store.commit(st)
    info = store.commits("seq")[0]
    with open(info.manifest_path) as f:
        manifest = json.load(f)
    manifest["size"] = claimed
    with open(info.manifest_path, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(CorruptCheckpointError):
        store.restore("seq", fingerprint=st.fingerprint)
    assert store.verify(), "verify must list the damaged commit"
