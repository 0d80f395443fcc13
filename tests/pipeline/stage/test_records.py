"""The small records the stage keeps in its state cell."""

from __future__ import annotations


def test_buffer_index_keeps_digests_whole():
    from linstream.pipeline.stage.records import BufferIndex

    index = BufferIndex(None)
    digests = {i: bytes([i] * 15 + [0]) for i in (5, 3, 9)}  # trailing NUL bytes
    for i, d in digests.items():
        index.add(i, d)
    again = BufferIndex(index.pack())
    assert [again.find(i) for i in (3, 5, 9)] == [digests[3], digests[5], digests[9]]
    assert again.find(4) is None and again.run_from(3) == 1
