"""The Kafka source of `linstream embed --streaming`: Beam's cross-language `ReadFromKafka`, and
the Java-side options a job on a Java runner needs (declared here so that `linstream embed`,
which refuses options nobody declares, accepts them).

`ReadFromKafka` is a Java transform: at submission an expansion service builds it
(`--kafka_expansion_service host:port`, e.g. the one built into Beam's Flink job server; without
it Beam downloads its expansion-service jar), and it runs in a Java SDK harness whose environment
`--default_environment_type` chooses: DOCKER (Java's default), PROCESS, EXTERNAL, or EMBEDDED
(inside the runner's own JVM, as Beam's Flink job server runs it: no Docker).

Where a resumed job starts reading: at the oldest message the topic still holds (with no
consumer group, the default; a `--kafka_group_id` whose offsets other consumers committed starts
there instead).  The source commits no consumer offsets (neither Kafka's auto-commit nor Beam's
commit on finalize): an offset committed for a read message can run ahead of the checkpoint
commit that covers its chunk, so a job resumed from committed offsets could skip chunks that no
checkpoint holds.  The checkpoint store is where a resumed job continues: it reads the topic
again and the stateful stage skips every chunk its sequences' checkpoints hold (counted as
duplicates), so a resume costs a read of the retained messages, never a chunk.  Size the
topic's retention to what a resume may need to read again.

Element timestamps are the consumer's processing time (`ReadFromKafka`'s default policy): the
stage's idle timer (event time) fires about `--idle-timeout` seconds after a sequence's last
message was read.
"""

from __future__ import annotations

import argparse
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from .reader_config import StreamConfig

__all__ = ["JavaRunnerOptions", "kafka_read_transform"]


class JavaRunnerOptions(PipelineOptions):
    """Options Beam's Java side reads (the Flink runner, the Java harness of cross-language
    transforms) that Beam's Python SDK does not declare; Python passes them on unchanged."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--checkpointing_interval",
            type=int,
            default=None,
            help="Flink: milliseconds between Flink's own checkpoints (a streaming job on Flink "
            "needs them: Beam's sinks and the Kafka source require stable input)",
        )
        parser.add_argument(
            "--finish_bundle_before_checkpointing",
            action="store_true",
            default=None,
            help="Flink: finish every open bundle before a checkpoint barrier passes (without "
            "it, a bundle open at a checkpoint has its outputs held back while its watermark "
            "goes ahead: a streaming job can then wait for ever for input it already read)",
        )
        parser.add_argument(
            "--number_of_execution_retries",
            type=int,
            default=None,
            help="Flink: how often a failed job is restarted (Flink's default with checkpoints: "
            "without end; a job whose LOOPBACK workers died with its command cannot recover)",
        )
        parser.add_argument(
            "--execution_retry_delay",
            type=int,
            default=None,
            help="Flink: milliseconds between two restarts of a failed job",
        )
        parser.add_argument(
            "--default_environment_type",
            default=None,
            help="where the Java SDK harness of the Kafka source runs: DOCKER (Java's default), "
            "PROCESS, EXTERNAL, or EMBEDDED (inside the runner's JVM: the task managers of "
            "Beam's Flink job server)",
        )
        parser.add_argument(
            "--default_environment_config",
            default=None,
            help="the Java harness environment's configuration (an image, a command, host:port)",
        )


def kafka_read_transform(config: StreamConfig) -> Any:
    """The `ReadFromKafka` transform ``config`` describes (built, not yet expanded): raw
    (key, value) byte pairs of ``config.kafka_topic`` (comma-separated topics), from the oldest
    retained message, committing no offsets (see the module docstring)."""
    from apache_beam.io.kafka import ReadFromKafka

    topics = [t.strip() for t in str(config.kafka_topic).split(",") if t.strip()]
    consumer = {
        "bootstrap.servers": str(config.kafka_bootstrap),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": "false",
    }
    if config.kafka_group_id:
        consumer["group.id"] = str(config.kafka_group_id)
    return ReadFromKafka(
        consumer_config=consumer,
        topics=topics,
        commit_offset_in_finalize=False,
        expansion_service=config.kafka_expansion_service,
    )
