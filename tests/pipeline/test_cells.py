"""The stage's state cell: buffered chunks and held outputs past the cell's budget go to the bags,
and the written outputs are the same whichever holds them."""

from __future__ import annotations

import linstream.pipeline.stage.cells as cells
import numpy as np
import pytest
from helpers.fake_state import FakeKey
from helpers.pipelines import run_transform
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.elements import ChunkResult
from linstream.pipeline.io import read_results

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _chunk(i: int) -> Chunk:
    return Chunk("s", i, np.arange(16, dtype=np.int32) + i)


def test_chunks_past_the_budget_go_to_the_bag_and_come_back(monkeypatch):
    one = len(cells.pack_records([(0, b"")])) + len(cells.encode_chunk(_chunk(0)))
    monkeypatch.setattr(cells, "HOLD_BYTES", 2 * one)  # two chunks fit in the cell
    key = FakeKey()
    buffer = key.buffer
    c = cells.Cells(key.cells)
    for i in (3, 1, 2, 5):
        c.hold_chunk(_chunk(i))
        c.index.add(i, bytes(16))
    c.meta.n_buffered = len(c.index)
    c.flush()
    assert [int(x.index) for x in buffer.items] == [2, 5]  # 3 and 1 stayed in the cell
    back = cells.Cells(key.cells)
    assert back.meta.chunks_in_bag and back.meta.n_buffered == 4
    got = back.held_chunks(range(1, 4), 1 << 20)
    assert sorted(got) == [1, 2, 3]
    assert all(np.array_equal(got[i].data, _chunk(i).data) for i in got)
    back.drop_chunks_below(5)
    assert back.meta.n_buffered == 1 and buffer.items  # chunk 5 still waits in the bag
    back.drop_chunks_below(6)
    assert not back.meta.chunks_in_bag and buffer.items == []


def test_small_chunks_never_read_the_bag():
    key = FakeKey()
    buffer, outbuf = key.buffer, key.outbuf
    c = cells.Cells(key.cells)
    for i in (2, 1):
        c.hold_chunk(_chunk(i))
        c.index.add(i, bytes(16))
        c.hold_output(ChunkResult("s", i, 16 * i, np.full(4, i, np.float32)))
    c.flush()
    back = cells.Cells(key.cells)
    assert sorted(back.held_chunks(range(1, 3), 1 << 20)) == [1, 2]
    assert [int(r.index) for r in back.held_outputs()] == [2, 1]
    back.clear_outputs()
    back.clear_chunks()
    assert buffer.reads == 0 and outbuf.reads == 0 and not buffer.items and not outbuf.items


def _raw(seed: int, n_chunks: int = 9) -> list[Chunk]:
    rng = np.random.default_rng(seed)
    out = []
    for s in range(2):
        for i in range(n_chunks):
            t = int(rng.integers(1, 5))
            q, k = rng.standard_normal((2, t, 2, 3))
            data = {"q": q, "k": k, "v": rng.standard_normal((t, 2, 2))}
            out.append(Chunk(f"s{s}", i, data, final=i == n_chunks - 1))
    return [out[int(i)] for i in rng.permutation(len(out))]


@pytest.mark.parametrize("hold", [0, 1 << 18], ids=["bags", "cell"])
def test_written_outputs_are_the_same_whichever_holds_them(hold, monkeypatch, tmp_path):
    seed = 7
    print(f"seed {seed}")
    chunks = _raw(seed)
    reference = run_transform(
        sorted(chunks, key=lambda c: (c.seq_id, c.index)),
        CausalLinearAttention(backend="numpy"),
        tmp_path,
    )
    monkeypatch.setattr(cells, "HOLD_BYTES", hold)  # the stage runs in this process
    out = str(tmp_path / f"out-{hold}")
    run = CausalLinearAttention(
        backend="numpy",
        checkpoint_every=3,
        checkpoint_dir=str(tmp_path / f"ckpt-{hold}"),
        output_dir=out,
    )
    got = run_transform(chunks, run, tmp_path)
    assert got.dead == []
    written = read_results(out)
    expected = reference.by_key()
    assert sorted(written) == sorted(expected)
    for key, (start, output) in written.items():
        assert start == expected[key].start_position
        want = np.asarray(expected[key].output, np.float32)
        np.testing.assert_array_equal(output, want.reshape(output.shape))
