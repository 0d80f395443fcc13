"""TestStream on BundleBasedDirectRunner: chunks over time, out of order, idle eviction, return."""

from __future__ import annotations

import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue
from helpers.pipelines import run_transform
from linstream.ops import get_feature_map
from linstream.ops.additive.naive import causal_recurrent
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def test_out_of_order_stream_with_idle_eviction_and_return(tmp_path):
    rng = np.random.default_rng(11)
    data, refs = {}, {}
    for s, n in (("a", 5), ("b", 2)):
        q, k, v = rng.standard_normal((3, n * 3, 2, 4))
        data[s] = [
            Chunk(
                s,
                i,
                {"q": q[3 * i : 3 * i + 3], "k": k[3 * i : 3 * i + 3], "v": v[3 * i : 3 * i + 3]},
                final=i == n - 1,
            )
            for i in range(n)
        ]
        refs[s] = causal_recurrent(q, k, v, feature_map=get_feature_map("elu+1"), eps=1e-6)[0]
    a, b = data["a"], data["b"]

    def at(t, *chunks):
        return [TimestampedValue(c, t) for c in chunks]

    stream = (
        _TestStream()
        .add_elements(at(1, a[2]))
        .add_elements(at(2, a[0], b[0]))
        .advance_watermark_to(5)
        .add_elements(at(6, a[1], a[1]))  # applies 1, then the buffered 2; one duplicate
        # Both sequences idle past the 10 s timeout: committed, then evicted from Beam state.
        .advance_watermark_to(100)
        .add_elements(at(101, a[4]))  # returns out of order: restored, 4 buffered
        .add_elements(at(102, a[3], b[1]))
        .advance_watermark_to_infinity()
    )
    ckpt = str(tmp_path / "ckpt")
    run = run_transform(
        stream,
        CausalLinearAttention(
            backend="numpy", checkpoint_dir=ckpt, checkpoint_every=100, idle_timeout=10
        ),
        tmp_path,
        ["--runner=BundleBasedDirectRunner", "--streaming"],
    )
    assert run.dead == []
    for s in ("a", "b"):
        got = [r for r in run.results if r.seq_id == s]
        assert [r.index for r in got] == list(range(len(data[s])))
        np.testing.assert_allclose(np.concatenate([r.output for r in got]), refs[s], atol=1e-12)
    # (BundleBasedDirectRunner reports the metrics of the first bundle only, so the evidence
    # of eviction is in the store.)  checkpoint_every=100: a commit before the final chunk can
    # only come from the idle timer, which commits and then clears the Beam state.  Had the
    # returning sequence not been restored from the store, its outputs above would be wrong
    # (a fresh state) or dead-lettered (restore_failed).
    store = CheckpointStore(ckpt)
    positions = {s: sorted(c.position for c in store.commits(s)) for s in ("a", "b")}
    assert positions == {"a": [9, 15], "b": [3, 6]}, positions
    assert {s: store.restore(s, fingerprint=_fp()).next_chunk for s in ("a", "b")} == {
        "a": 5,
        "b": 2,
    }


def _fp():
    return CausalLinearAttention().step.fingerprint
