"""What the readers are told, as frozen values: `InputConfig` (files, for `read_input`) and
`StreamConfig` (a Pub/Sub or Kafka source, for `read_stream_chunks`).

The embed job builds both once from its options; a pipeline of your own builds them directly,
`InputConfig(input="texts/", chunk_tokens=512)`.  `StreamConfig`'s fields are also the
streaming source flags (`add_streaming_args` adds one per field, help and metavar from here).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["InputConfig", "StreamConfig", "add_streaming_args"]


@dataclass(frozen=True)
class InputConfig:
    """The files to read and how: the `linstream embed` options of the same names.

    input: a folder of text files, a file, a glob, or globs joined by ','.
    input_format: auto, chunks, text, jsonl, parquet-text or tokens-jsonl.
    id_column, text_column, tokens_column: the columns of jsonl / parquet-text / tokens-jsonl.
    tokenizer: a tokenizer.json path or builtin:bytes; None: the one the model names.
    chunk_tokens: tokens per chunk when text or token lists are cut into chunks.
    model: the model the tokens are for (its vocabulary is checked against the tokenizer).
    """

    input: str | None = None
    input_format: str = "auto"
    id_column: str = "id"
    text_column: str = "text"
    tokens_column: str = "tokens"
    tokenizer: str | None = None
    chunk_tokens: int = 2048
    model: str = "builtin:default"


def _option(help_text: str, default: Any = None, metavar: str | None = None) -> Any:
    return field(default=default, metadata={"help": help_text, "metavar": metavar})


@dataclass(frozen=True)
class StreamConfig:
    """The source of `--streaming`: exactly one of Pub/Sub (a subscription or a topic) or Kafka
    (bootstrap servers and topics); `source_kind` says which, or why neither."""

    pubsub_subscription: str | None = _option(
        "read chunk messages from this Pub/Sub subscription (preferred: no message loss "
        "across job restarts)",
        metavar="projects/P/subscriptions/S",
    )
    pubsub_topic: str | None = _option(
        "read from a topic (the runner creates a temporary subscription)",
        metavar="projects/P/topics/T",
    )
    pubsub_timestamp_attribute: str | None = _option(
        "message attribute holding the event time (default: publish time)"
    )
    dead_letter_topic: str | None = _option(
        "publish undecodable messages' dead letters (JSON) to this Pub/Sub topic",
        metavar="projects/P/topics/T",
    )
    kafka_bootstrap: str | None = _option("Kafka brokers", metavar="HOST:PORT[,...]")
    kafka_topic: str | None = _option("Kafka topic(s), comma-separated")
    kafka_group_id: str | None = _option(
        "Kafka consumer group id (default: none; linstream commits no offsets and reads each "
        "topic from its oldest retained message; a group whose offsets other consumers "
        "committed starts there instead)"
    )
    kafka_expansion_service: str | None = _option(
        "a running Kafka expansion service (default: Beam starts its Java jar)",
        metavar="HOST:PORT",
    )


def add_streaming_args(parser: argparse.ArgumentParser) -> None:
    """Add `--streaming` (unless the parser has it) and the Pub/Sub and Kafka source options:
    one per field of `StreamConfig`, named as the field.

    Idempotent: a parser that already has the source options is left as it is.
    """
    if "--pubsub_subscription" in parser._option_string_actions:
        return
    if "--streaming" not in parser._option_string_actions:
        parser.add_argument(
            "--streaming", action="store_true", help="read chunks from Pub/Sub or Kafka"
        )
    g = parser.add_argument_group("streaming sources (with --streaming)")
    for f in dataclasses.fields(StreamConfig):
        kw: dict[str, Any] = {"default": f.default, "help": f.metadata["help"]}
        if f.metadata["metavar"]:
            kw["metavar"] = f.metadata["metavar"]
        g.add_argument(f"--{f.name}", **kw)
