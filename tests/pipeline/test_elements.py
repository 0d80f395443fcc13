"""Element coders: deterministic, not pickle, round trip every payload kind."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from linstream.pipeline import Chunk, ChunkResult
from linstream.pipeline.elements import (
    ChunkCoder,
    ChunkResultCoder,
    DeadLetter,
    DeadLetterCoder,
    Unencodable,
)

RNG = np.random.default_rng(7)

CHUNKS = {
    "tokens": Chunk("s", 3, np.arange(5, dtype=np.int32), final=True),
    "features": Chunk("s", 0, RNG.standard_normal((4, 3)).astype(np.float32)),
    "qkv": Chunk(
        "séq/1",
        2,
        {n: RNG.standard_normal((3, 2, 4)) for n in "qkv"},
    ),
    "big-endian": Chunk("s", 1, np.arange(4, dtype=">f8")),
    "negative-index": Chunk("s", -4, np.zeros(2, np.int64)),
    "float-index": Chunk("s", 1.5, np.zeros(2, np.int64)),
    "string-index": Chunk("s", "3", np.zeros(2, np.int64)),
    "none-data": Chunk("s", 0, None),
    "ragged": Chunk("s", 0, [[1, 2], [3]]),
    "strings": Chunk("s", 0, np.array(["a", "b"])),
    "empty": Chunk("s", 0, np.zeros((0,), np.int32)),
}


@pytest.mark.parametrize("name", sorted(CHUNKS))
def test_chunk_round_trip(name):
    coder = ChunkCoder()
    c = CHUNKS[name]
    back = coder.decode(coder.encode(c))
    assert back.seq_id == c.seq_id and back.final == c.final
    if name in ("ragged", "strings"):
        assert isinstance(back.data, Unencodable)
    elif name == "big-endian":
        np.testing.assert_array_equal(back.data, c.data)
    elif name == "string-index":
        assert back.index == "'3'" and not isinstance(back.index, int)
    else:
        assert back == c, (back, c)
    # Deterministic: encoding the decoded element gives the same bytes.
    assert coder.encode(back) == coder.encode(coder.decode(coder.encode(back)))


def test_dict_key_order_does_not_change_bytes():
    a = {"q": np.ones((1, 1, 1)), "k": np.zeros((1, 1, 1)), "v": np.ones((1, 1, 1))}
    b = {"v": a["v"], "q": a["q"], "k": a["k"]}
    assert ChunkCoder().encode(Chunk("x", 0, a)) == ChunkCoder().encode(Chunk("x", 0, b))


def test_result_and_dead_letter_round_trip():
    r = ChunkResult("s", 4, 100, RNG.standard_normal((3, 8)).astype(np.float32))
    assert ChunkResultCoder().decode(ChunkResultCoder().encode(r)) == r
    d = DeadLetter("s", None, "bad_index", "expected an integer")
    assert DeadLetterCoder().decode(DeadLetterCoder().encode(d)) == d
    d2 = DeadLetter("s", 7, "gap", "waited")
    assert tuple(DeadLetterCoder().decode(DeadLetterCoder().encode(d2))) == (
        "s",
        7,
        "gap",
        "waited",
    )


def test_registered_coders_are_deterministic_and_not_pickle():
    for cls, coder_cls in (
        (Chunk, ChunkCoder),
        (ChunkResult, ChunkResultCoder),
        (DeadLetter, DeadLetterCoder),
    ):
        coder = beam.coders.registry.get_coder(cls)
        assert isinstance(coder, coder_cls)
        assert coder.is_deterministic()
    key_coder = beam.coders.registry.get_coder(beam.typehints.Tuple[str, Chunk])
    assert key_coder.is_deterministic()
    assert b"pickle" not in ChunkCoder().encode(CHUNKS["qkv"])


def test_truncated_bytes_raise_a_clear_error():
    data = ChunkCoder().encode(CHUNKS["tokens"])
    with pytest.raises(ValueError, match="truncated"):
        ChunkCoder().decode(data[:-3])
