"""A Kafka broker for the streaming engine test (KRaft, one node, loopback, Kafka 4.1 jars from
deploy/engines/fetch.sh), and chunks produced to it as messages in the formats
`linstream embed --streaming` reads (stream_messages.py): JSON and Arrow IPC, keyed by sequence."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa

from helpers.engine_servers import Server, free_port, start_server

BROKER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{broker},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{broker}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data}
num.partitions=2
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
"""


def start_broker(lib: str, workdir: Path) -> Server:
    """Format a KRaft log folder and start one broker+controller on free loopback ports."""
    ports = {"broker": free_port(), "controller": free_port()}
    workdir.mkdir(parents=True, exist_ok=True)
    props = workdir / "server.properties"
    props.write_text(BROKER_PROPERTIES.format(data=workdir / "data", **ports))
    cluster = "-"
    while cluster.startswith("-"):  # as Kafka's own ids: one led by "-" reads as an option
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    java = ["java", "-Xmx512m", "-cp", f"{lib}/*"]
    fmt = subprocess.run(
        [*java, "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(props)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    return start_server(
        "kafka-broker", [*java, "kafka.Kafka", str(props)], workdir, ports, ready_port="broker"
    )


def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    """A topic that keeps its messages (retention.ms=-1): a resumed job reads it again."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    new.config = {"retention.ms": "-1"}
    for future in admin.create_topics([new], request_timeout=60).values():
        future.result(timeout=60)


def json_message(chunk) -> bytes:
    return json.dumps(
        {
            "seq_id": chunk.seq_id,
            "chunk_index": chunk.index,
            "final": chunk.final,
            "tokens": [int(t) for t in chunk.data],
        }
    ).encode()


def arrow_message(chunk, *, file: bool = False) -> bytes:
    from linstream.pipeline.io import chunks_to_table

    table = chunks_to_table([chunk])
    sink = io.BytesIO()
    writer = pa.ipc.new_file if file else pa.ipc.new_stream
    with writer(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def produce(bootstrap: str, topic: str, messages: list[tuple[str | None, bytes]]) -> None:
    """Send (key, value) messages in this order and wait until the broker has them all."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failed: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    for key, value in messages:
        producer.produce(
            topic, key=key.encode() if key else None, value=value, on_delivery=on_delivery
        )
    left = producer.flush(60)
    assert left == 0 and not failed, f"{left} message(s) not delivered; errors {failed[:3]}"
