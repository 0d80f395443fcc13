"""Stream message decoding (Pub/Sub, Kafka): good messages become Chunks, bad ones dead letters."""

from __future__ import annotations

import argparse
import io
import json
import os
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.pipeline.elements import Chunk
from linstream.pipeline.io import chunks_to_table
from linstream.pipeline.io.streaming import (
    ARROW_STREAM_CONTENT_TYPE,
    BadMessage,
    DecodeStreamMessages,
    StreamConfig,
    StreamSourceError,
    add_streaming_args,
    decode_message,
    kafka_read_transform,
    source_kind,
)


def _json(**obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _arrow(chunks: list[Chunk], input_dim: int | None = None, *, file: bool = False) -> bytes:
    table = chunks_to_table(chunks, input_dim)
    sink = io.BytesIO()
    opener = pa.ipc.new_file if file else pa.ipc.new_stream
    with opener(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def test_json_tokens_and_features() -> None:
    (c,) = decode_message(_json(seq_id="s", chunk_index=3, final=True, tokens=[1, 2, 3]))
    assert c == Chunk("s", 3, np.array([1, 2, 3], np.int32), True)
    (f,) = decode_message(_json(chunk_index=0, features=[[1, 2], [3.5, 4]]), key="k")
    assert f == Chunk("k", 0, np.array([[1, 2], [3.5, 4]], np.float32), False)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), file=st.booleans())
def test_arrow_messages_round_trip(seed: int, file: bool) -> None:
    rng = np.random.default_rng(seed)
    dim = int(rng.integers(1, 5))
    chunks = [
        Chunk(f"s{i}", int(rng.integers(0, 100)), rng.random((int(rng.integers(1, 6)), dim)))
        for i in range(int(rng.integers(1, 4)))
    ]
    chunks = [Chunk(c.seq_id, c.index, c.data.astype(np.float32), c.final) for c in chunks]
    assert decode_message(_arrow(chunks, dim, file=file)) == chunks
    toks = [Chunk("t", 0, rng.integers(0, 1000, 7).astype(np.int32), True)]
    ctype = None if file else ARROW_STREAM_CONTENT_TYPE
    assert decode_message(_arrow(toks, file=file), content_type=ctype, key="t") == toks


@pytest.mark.parametrize(
    ("data", "kwargs", "reason", "words"),
    [
        (b"\x00\x01garbage", {}, "undecodable_message", "JSON object or Arrow"),
        (b"{not json", {}, "undecodable_message", "not UTF-8 JSON"),
        (b'{"seq_id": "s", "chunk_index": 0, "tokens": [1]}\xff', {}, "undecodable_message", ""),
        (b"\xff\xff\xff\xff\x00\x01", {}, "undecodable_message", "Arrow IPC"),
        (_json(chunk_index=0, tokens=[1]), {}, "bad_message", "'seq_id'"),
        (_json(seq_id="s", tokens=[1]), {}, "bad_message", "'chunk_index'"),
        (_json(seq_id="s", chunk_index=1.5, tokens=[1]), {}, "bad_message", "'chunk_index'"),
        (_json(seq_id="s", chunk_index=0, final="yes", tokens=[1]), {}, "bad_message", "'final'"),
        (_json(seq_id="s", chunk_index=0), {}, "bad_message", "'tokens' or 'features'"),
        (_json(seq_id="s", chunk_index=0, tokens=[1.5]), {}, "bad_message", "integers"),
        (_json(seq_id="s", chunk_index=0, features=[[1], [2, 3]]), {}, "bad_message", "width"),
        (_json(seq_id="s", chunk_index=0, tokens=[1]), {"key": "t"}, "key_mismatch", "'t'"),
        (_json(seq_id="s", chunk_index=0, tokens=[1]), {"content_type": "text/csv"}, "", "csv"),
    ],
    ids=[
        "garbage",
        "bad-json",
        "bad-utf8",
        "bad-arrow",
        "no-seq-id",
        "no-index",
        "float-index",
        "str-final",
        "no-payload",
        "float-tokens",
        "ragged-features",
        "key-mismatch",
        "unknown-content-type",
    ],
)
def test_bad_messages_are_named(data: bytes, kwargs: dict[str, Any], reason: str, words: str):
    with pytest.raises(BadMessage) as info:
        decode_message(data, **kwargs)
    assert info.value.reason == (reason or "undecodable_message")
    assert words in info.value.message


def test_decode_transform_splits_chunks_and_dead_letters() -> None:
    good = _json(seq_id="a", chunk_index=0, tokens=[5, 6])
    messages = [
        PubsubMessage(good, {"seq_id": "a"}),
        PubsubMessage(_arrow([Chunk("b", 1, np.array([7], np.int32), True)]), {}),
        PubsubMessage(b"junk", {}),
        PubsubMessage(good, {"seq_id": "zz"}),
    ]
    kafka = [(b"c", _json(chunk_index=2, tokens=[1])), (b"\xff", good), ("not", "a", "pair")]
    opts = PipelineOptions(["--runner=FnApiRunner"])
    with beam.Pipeline(options=opts) as p:
        chunks, dead = p | "P" >> beam.Create(messages) | "DP" >> DecodeStreamMessages("pubsub")
        kchunks, kdead = p | "K" >> beam.Create(kafka) | "DK" >> DecodeStreamMessages("kafka")
        assert_that(
            chunks | "PC" >> beam.Map(lambda c: (c.seq_id, c.index, c.data.tolist(), c.final)),
            equal_to([("a", 0, [5, 6], False), ("b", 1, [7], True)]),
            label="pubsub chunks",
        )
        assert_that(
            dead | "PD" >> beam.Map(lambda d: (d.seq_id, d.chunk_index, d.reason)),
            equal_to([("", None, "undecodable_message"), ("a", 0, "key_mismatch")]),
            label="pubsub dead letters",
        )
        assert_that(
            kchunks | "KC" >> beam.Map(lambda c: (c.seq_id, c.index)),
            equal_to([("c", 2)]),
            label="kafka chunks",
        )
        assert_that(
            kdead | "KD" >> beam.Map(lambda d: d.reason),
            equal_to(["undecodable_message", "undecodable_message"]),
            label="kafka dead letters",
        )


def test_source_options() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streaming", action="store_true")  # as linstream embed has it
    add_streaming_args(parser)
    add_streaming_args(parser)  # idempotent
    args = parser.parse_args(["--streaming", "--kafka_bootstrap=k:9092", "--kafka_topic=a,b"])
    config = StreamConfig(**{n: v for n, v in vars(args).items() if n != "streaming"})
    assert source_kind(config) == "kafka"
    read = kafka_read_transform(config)  # built, not expanded: no Java needed
    assert read is not None
    assert source_kind(StreamConfig(pubsub_subscription="projects/p/subscriptions/s")) == "pubsub"
    for bad in (
        {},
        {"pubsub_topic": "t", "pubsub_subscription": "s"},
        {"kafka_bootstrap": "k:9092"},
        {"pubsub_topic": "t", "kafka_topic": "k"},
    ):
        with pytest.raises(StreamSourceError):
            source_kind(StreamConfig(**bad))


def test_kafka_read_expands_through_an_expansion_service() -> None:
    service = os.environ.get("LINSTREAM_KAFKA_EXPANSION_SERVICE")
    if not service:
        pytest.skip(
            "set LINSTREAM_KAFKA_EXPANSION_SERVICE=host:port (a running Beam Kafka expansion "
            "service) to expand ReadFromKafka; without it Beam downloads the Java expansion jar "
            "from Maven Central, which this offline run cannot"
        )
    from linstream.pipeline.io.streaming import read_stream_chunks

    args = {"kafka_bootstrap": "k:9092", "kafka_topic": "c", "kafka_expansion_service": service}
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", "--streaming"]))
    read_stream_chunks(p, StreamConfig(**args), with_dead_letters=True)
    proto = p.to_runner_api()
    assert any("ReadKafka" in t.unique_name for t in proto.components.transforms.values())


def _deep_json(depth: int) -> bytes:
    return b'{"seq_id": "s", "chunk_index": 0, "tokens": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    ("data", "reason", "words"),
    [
        (_deep_json(100_000), "undecodable_message", "nested too deeply"),
        (
            b'{"seq_id": "s", "chunk_index": 0, "tokens": [' + b"9" * 5000 + b"]}",
            "undecodable_message",
            "cannot convert",
        ),
        (_json(seq_id="s", chunk_index=0, tokens=[1, 2**64]), "bad_message", "64-bit"),
        (_json(seq_id="s", chunk_index=0, tokens=[-(2**63) - 1]), "bad_message", "64-bit"),
        (_json(seq_id="s", chunk_index=2**64, tokens=[1]), "bad_message", "64-bit"),
        (_json(seq_id="s", chunk_index=0, features=[[10**400]]), "bad_message", "float range"),
        (b'{"seq_id": "\\ud800", "chunk_index": 0, "tokens": [1]}', "bad_message", "UTF-8"),
    ],
    ids=[
        "deep-json",
        "5000-digit-int",
        "token-2**64",
        "token-below-int64",
        "index-2**64",
        "feature-10**400",
        "lone-surrogate-seq-id",
    ],
)
def test_hostile_json_is_a_named_bad_message(data: bytes, reason: str, words: str) -> None:
    """RecursionError, ValueError and OverflowError never escape the decoder."""
    with pytest.raises(BadMessage) as info:
        decode_message(data)
    assert info.value.reason == reason
    assert words in info.value.message


def test_hostile_messages_become_dead_letters_in_the_transform() -> None:
    messages = [
        _deep_json(100_000),
        _json(seq_id="s", chunk_index=0, tokens=[2**64]),
        b'{"seq_id": "s", "chunk_index": 0, "tokens": [' + b"9" * 5000 + b"]}",
        _json(seq_id="ok", chunk_index=0, tokens=[3]),
    ]
    opts = PipelineOptions(["--runner=FnApiRunner"])
    with beam.Pipeline(options=opts) as p:
        chunks, dead = p | beam.Create(messages) | DecodeStreamMessages("bytes")
        assert_that(
            chunks | "C" >> beam.Map(lambda c: (c.seq_id, c.index)),
            equal_to([("ok", 0)]),
            label="chunks",
        )
        assert_that(
            dead | "D" >> beam.Map(lambda d: d.reason),
            equal_to(["undecodable_message", "bad_message", "undecodable_message"]),
            label="dead letters",
        )


def test_an_undecodable_message_is_charged_to_its_key() -> None:
    """Bytes that are neither JSON nor Arrow: the dead letter names the key's sequence."""
    with pytest.raises(BadMessage) as info:
        decode_message(b"not a chunk", key="s7")
    assert (info.value.reason, info.value.seq_id) == ("undecodable_message", "s7")
