"""A commit that reuses an old orphan data file restarts its GC grace period."""

import os
import time

from helpers.store_faults import random_state
from linstream.state import CheckpointStore


def test_reused_orphan_gets_a_fresh_grace_period(tmp_path):
    store = CheckpointStore(str(tmp_path))
    st = random_state(3, seq_id="seq")
    store.commit(st)
    info = store.commits("seq")[0]
    assert info.data_path is not None
    os.remove(info.manifest_path)  # a crash before the manifest: the data file is an orphan
    os.utime(info.data_path, (0, 0))  # ... and an old one
    assert [p for p, _ in store.listing.orphan_files()] == [info.data_path]

    store.commit(st)  # the retried commit reuses the content-addressed file
    assert time.time() - os.path.getmtime(info.data_path) < 600
    store.flush()
    assert info.data_path not in store.gc(grace_seconds=3600)
    assert store.restore("seq", fingerprint=st.fingerprint) == st
