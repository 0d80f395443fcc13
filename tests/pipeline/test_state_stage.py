"""The stage's initial-state hook with raw attention (a step whose state shape comes from the
chunk), driven as a runner drives it: a state exported from one job starts a sequence of another
exactly where the first left off, in any arrival order; a file that cannot start a sequence
dead-letters that sequence's chunks (`initial_state`) and the others go on."""

from __future__ import annotations

import numpy as np
from helpers.stage_runs import run_stage
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.state import CheckpointStore
from linstream.state.exchange import write_state_file


def _chunks(seq_id, seed, n=6, first=0):
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = int(rng.integers(1, 6))
        q, k = rng.standard_normal((2, t, 2, 3))
        v = rng.standard_normal((t, 2, 2))
        out.append(Chunk(seq_id, first + i, {"q": q, "k": k, "v": v}, final=i == n - 1))
    return out


def test_raw_attention_continues_from_an_exported_state_bit_for_bit(tmp_path):
    chunks = _chunks("a", 5)
    ckpt = str(tmp_path / "ckpt")
    whole = run_stage(chunks, CausalLinearAttention(backend="numpy")).by_key()
    run_stage(chunks[:2], CausalLinearAttention(backend="numpy", checkpoint_dir=ckpt))
    head = CheckpointStore(ckpt).head("a", fingerprint=None)
    assert head is not None and head.state.next_chunk == 2
    st = head.state
    path = str(tmp_path / "a2.safetensors")
    write_state_file(path, st)
    # b is a's chunks 2.. as a new input (chunks from 0), sent in reverse order
    rest = [Chunk("b", c.index - 2, c.data, c.final) for c in chunks[2:]][::-1]
    fresh = _chunks("c", 6, n=2)
    run = run_stage(
        rest + fresh,
        CausalLinearAttention(backend="numpy", initial_state=(("b", path),)),
    )
    assert run.dead == []
    got = run.by_key()
    for i in range(4):
        b, a = got[("b", i)], whole[("a", i + 2)]
        assert (
            b.start_position
            == a.start_position
            == st.position + sum(len(c.data["q"]) for c in chunks[2 : 2 + i])
        )
        assert b.output.tobytes() == a.output.tobytes()
    assert got[("c", 0)].start_position == 0  # no file for c: the zero state


def test_a_file_that_cannot_start_a_sequence_dead_letters_its_chunks_only(tmp_path):
    bad = tmp_path / "gone.safetensors"
    bad.write_bytes(b"\x00" * 12)
    run = run_stage(
        _chunks("b", 7, n=2) + _chunks("c", 8, n=2),
        CausalLinearAttention(backend="numpy", initial_state=(("b", str(bad)),)),
    )
    assert [(d.seq_id, d.chunk_index, d.reason) for d in run.dead] == [
        ("b", 0, "initial_state"),
        ("b", 1, "initial_state"),
    ]
    assert f"state file {bad}: expected a safetensors file" in run.dead[0].message
    assert sorted(run.by_key()) == [("c", 0), ("c", 1)]
