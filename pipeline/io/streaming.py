"""Unbounded chunk sources for `linstream embed --streaming`: Pub/Sub (Dataflow) and Kafka.

    chunks = read_stream_chunks(pipeline, config)                     # PCollection[Chunk]
    chunks, dead = read_stream_chunks(pipeline, config, with_dead_letters=True)

`config` is a `StreamConfig` (reader_config.py; its fields are the options `add_streaming_args`
adds): exactly one source, `--pubsub_subscription` or `--pubsub_topic` (Beam's `ReadFromPubSub`;
Dataflow, or a runner with a Pub/Sub emulator) or `--kafka_bootstrap` with `--kafka_topic`
(Beam's cross-language `ReadFromKafka`, kafka_source.py: a Java expansion service and a Java SDK
harness, e.g. Dataflow runner v2, or Beam's Flink job server with the harness embedded).

The parts: the message formats and their decoding are in stream_messages.py (one message, one
chunk, JSON or Arrow IPC; a bad message is a dead letter, never a failed bundle), the Kafka
source and its Java-side options in kafka_source.py; this module picks the source and wires
them.  Its names are re-exported here.

Produce with key = seq_id (Kafka) or ordering key = seq_id (Pub/Sub) so one sequence's chunks
mostly stay in order; the stateful stage reorders and de-duplicates anyway.

Element timestamps: Pub/Sub publish time, or the attribute named by `--pubsub_timestamp_attribute`;
Kafka: the consumer's processing time (`ReadFromKafka`'s default policy).  The stage's idle timer
runs in event time, so these decide when an idle sequence is committed and evicted.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import apache_beam as beam
from linstream.pipeline.elements import DeadLetter

from .kafka_source import JavaRunnerOptions, kafka_read_transform
from .reader_config import StreamConfig, add_streaming_args
from .stream_messages import (
    ARROW_FILE_CONTENT_TYPE,
    ARROW_STREAM_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    BadMessage,
    DecodeStreamMessages,
    decode_message,
)

__all__ = [
    "ARROW_FILE_CONTENT_TYPE",
    "ARROW_STREAM_CONTENT_TYPE",
    "JSON_CONTENT_TYPE",
    "BadMessage",
    "DecodeStreamMessages",
    "JavaRunnerOptions",
    "StreamConfig",
    "StreamSourceError",
    "add_streaming_args",
    "decode_message",
    "kafka_read_transform",
    "read_stream_chunks",
    "source_kind",
]

_log = logging.getLogger(__name__)


class StreamSourceError(ValueError):
    """The streaming options name no source, two sources, or an incomplete one."""


# -- options ---------------------------------------------------------------------------------


def source_kind(config: StreamConfig) -> str:
    """``"pubsub"`` or ``"kafka"`` for the source ``config`` names; StreamSourceError otherwise."""
    sub, topic = config.pubsub_subscription, config.pubsub_topic
    boot, ktopic = config.kafka_bootstrap, config.kafka_topic
    pubsub = bool(sub or topic)
    kafka = bool(boot or ktopic)
    if pubsub and kafka:
        msg = "--streaming takes one source: Pub/Sub or Kafka options were both given"
        raise StreamSourceError(msg)
    if pubsub:
        if sub and topic:
            msg = (
                "give --pubsub_subscription or --pubsub_topic, not both "
                f"(got {sub!r} and {topic!r})"
            )
            raise StreamSourceError(msg)
        return "pubsub"
    if kafka:
        if not (boot and ktopic):
            msg = (
                "Kafka needs both --kafka_bootstrap and --kafka_topic "
                f"(got bootstrap={boot!r}, topic={ktopic!r})"
            )
            raise StreamSourceError(msg)
        return "kafka"
    msg = (
        "--streaming needs a source: --pubsub_subscription or --pubsub_topic (Pub/Sub), or "
        "--kafka_bootstrap with --kafka_topic (Kafka)"
    )
    raise StreamSourceError(msg)


# -- sources ----------------------------------------------------------------------------------


def _read_pubsub(pipeline: Any, config: StreamConfig) -> Any:
    return pipeline | "ReadPubSub" >> beam.io.ReadFromPubSub(
        topic=config.pubsub_topic,
        subscription=config.pubsub_subscription,
        with_attributes=True,
        timestamp_attribute=config.pubsub_timestamp_attribute,
    )


def _dead_letter_json(d: DeadLetter) -> bytes:
    return json.dumps(d.as_dict(), sort_keys=True).encode("utf-8")


def _log_dead(d: DeadLetter) -> DeadLetter:
    _log.warning("linstream stream dead letter: %s", d)
    return d


def read_stream_chunks(
    pipeline: Any, config: StreamConfig, *, with_dead_letters: bool = False
) -> Any:
    """The unbounded `PCollection` of `Chunk`s that ``config``'s source delivers.

    With ``with_dead_letters=True`` returns ``(chunks, dead_letters)`` so the caller can merge
    the undecodable messages into the job's dead-letter output (what `linstream embed` should
    do).  Without it, dead letters are logged, counted (``stream_dead_letters``) and, with
    `--dead_letter_topic`, published there as JSON.
    """
    kind = source_kind(config)
    if kind == "pubsub":
        raw = _read_pubsub(pipeline, config)
    else:
        raw = pipeline | "ReadKafka" >> kafka_read_transform(config)
    chunks, dead = raw | "DecodeMessages" >> DecodeStreamMessages(kind)
    if with_dead_letters:
        return chunks, dead
    logged = dead | "LogStreamDeadLetters" >> beam.Map(_log_dead)
    topic = config.dead_letter_topic
    if topic:
        _ = (
            logged
            | "DeadLettersToJson" >> beam.Map(_dead_letter_json).with_output_types(bytes)
            | "PublishDeadLetters" >> beam.io.WriteToPubSub(topic)
        )
    return chunks
