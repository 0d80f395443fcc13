"""The Beam adapter is faithful: on a runner, the transform writes, emits, dead-letters and counts
exactly what its stage does without one (tests/helpers/stage_runs.py), for one input that
exercises every path of the stage — shuffled and resent chunks, buffered runs, commits with
their output spans, refusals of every kind (odd chunk indices through Beam's coder included) and
a gap still open when the input ends (the idle timer).  What the stage decides is tested on the
stage itself (tests/pipeline/stage/); this checks the DoFn's state specs, timer, outputs, coders
and metrics around it.  (FnApiRunner with one worker hands a key its elements in input order, as
the driver does; the other runner tests rely on that too.)"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.pipelines import run_transform
from helpers.stage_runs import run_stage
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.io import read_results
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

SEED = 20261202


def _qkv(rng, t, h=2, dk=3, dv=2):
    q, k = rng.standard_normal((2, t, h, dk))
    return {"q": q, "k": k, "v": rng.standard_normal((t, h, dv))}


def _input(seed: int) -> list[Chunk]:
    rng = np.random.default_rng(seed)
    chunks = []
    for s in range(3):  # whole sequences of random lengths
        n = int(rng.integers(3, 9))
        chunks += [
            Chunk(f"s{s}", i, _qkv(rng, int(rng.integers(1, 6))), final=i == n - 1)
            for i in range(n)
        ]
    chunks += [chunks[int(i)] for i in rng.integers(0, len(chunks), size=4)]  # resent
    chunks += [
        Chunk("s0", 1, _qkv(rng, 2)),  # conflicting resend
        Chunk("s1", 9, _qkv(rng, 2)),  # after the final chunk (at most 8 chunks)
        Chunk("far", 30, _qkv(rng, 2)),  # beyond the buffer bound
        Chunk("bad", 0, _qkv(rng, 2)),
        Chunk("bad", 1, {"q": np.ones((2, 2, 3), np.int64)}),  # missing keys
        Chunk("bad", 2, {**_qkv(rng, 2), "k": np.full((2, 2, 3), np.nan)}),
        Chunk("bad", -1, _qkv(rng, 2)),
        Chunk("bad", 1.5, _qkv(rng, 2)),
        Chunk("bad", "1", _qkv(rng, 2)),
        Chunk("bad", 1, np.zeros(3)),  # not a mapping
        Chunk("gap", 0, _qkv(rng, 2)),
        Chunk("gap", 2, _qkv(rng, 2)),  # chunk 1 never comes: a gap at the end of the input
        Chunk("gap", 3, _qkv(rng, 2), final=True),
    ]
    return [chunks[int(i)] for i in rng.permutation(len(chunks))]


def test_the_transform_on_a_runner_does_what_its_stage_does(tmp_path):
    print(f"seed={SEED}")
    chunks = _input(SEED)

    def attention(name: str) -> CausalLinearAttention:
        return CausalLinearAttention(
            backend="numpy",
            checkpoint_dir=str(tmp_path / name / "ckpt"),
            output_dir=str(tmp_path / name / "out"),
            checkpoint_every=2,
            max_buffered_chunks=16,
        )

    on_runner = run_transform(chunks, attention("runner"), tmp_path)
    alone = run_stage(chunks, attention("alone"))

    def results(run):
        return [(r.seq_id, r.index, r.start_position, r.output.tobytes()) for r in run.results]

    assert results(on_runner) == results(alone) and len(alone.results) > 10
    reasons = {d.reason for d in alone.dead}
    assert reasons == {
        "conflicting_duplicate",
        "after_final",
        "beyond_buffer",
        "bad_payload",
        "non_finite",
        "bad_index",
        "gap",
    }, reasons
    assert on_runner.dead == alone.dead
    assert on_runner.counters == alone.counters
    assert alone.counters["commits"] > 3 and alone.counters["duplicates"] >= 1
    # The files each wrote: the same result spans, the same commit chains.
    written = {name: read_results(str(tmp_path / name / "out")) for name in ("runner", "alone")}
    assert written["runner"].keys() == written["alone"].keys() and written["alone"]
    for key, (start, output) in written["alone"].items():
        assert written["runner"][key][0] == start
        assert written["runner"][key][1].tobytes() == output.tobytes()
    stores = {name: CheckpointStore(str(tmp_path / name / "ckpt")) for name in written}
    for seq in ("s0", "s1", "s2", "gap", "bad"):
        chains = [[(c.position, c.next_chunk) for c in stores[n].commits(seq)] for n in stores]
        assert chains[0] == chains[1] and chains[0], (seq, chains)
