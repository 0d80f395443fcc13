"""Publish dead letters to a Pub/Sub topic (`--dead_letter_topic`), one JSON message each.

The publisher is injectable: ``publisher_factory()`` returns an object with
``publish(topic, data: bytes, **attributes) -> future`` (the shape of
``google.cloud.pubsub_v1.PublisherClient``, the default), and a bundle finishes only when every
future of its messages has resolved, so a failed publish fails (and retries) the bundle instead
of losing the letter.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable
from typing import Any, Never

import apache_beam as beam
from linstream.pipeline.elements import DeadLetter

__all__ = ["PublishDeadLetters", "dead_letter_message"]

#: How long a bundle waits for Pub/Sub to acknowledge one message.
PUBLISH_TIMEOUT_S = 60.0


def dead_letter_message(d: DeadLetter) -> tuple[bytes, dict[str, str]]:
    """(data, attributes) of one dead letter's message: the JSON object, and its sequence id
    and reason as attributes (for subscription filters)."""
    data = json.dumps(d.as_dict(), sort_keys=True).encode("utf-8")
    return data, {"seq_id": str(d.seq_id), "reason": str(d.reason)}


def _pubsub_publisher() -> Any:
    # google-cloud-pubsub comes with apache-beam[gcp] (the `gcp` extra, every worker image).
    pubsub_v1 = importlib.import_module("google.cloud.pubsub_v1")
    return pubsub_v1.PublisherClient()


class _PublishFn(beam.DoFn):
    def __init__(self, topic: str, publisher_factory: Callable[[], Any] | None) -> None:
        self.topic = topic
        self.publisher_factory = publisher_factory
        self._client: Any = None
        self._futures: list[Any] = []

    def setup(self) -> None:
        self._client = (self.publisher_factory or _pubsub_publisher)()

    def start_bundle(self) -> None:
        self._futures = []

    # Emits nothing, so returns an empty iterable: Beam takes the return annotation as the
    # output type hint and needs an iterable there (from 2.78, which resolves postponed
    # annotations, it refuses `-> None`).
    def process(self, d: DeadLetter) -> Iterable[Never]:
        data, attributes = dead_letter_message(d)
        self._futures.append(self._client.publish(self.topic, data, **attributes))
        return ()

    def finish_bundle(self) -> None:
        futures, self._futures = self._futures, []
        for f in futures:
            f.result(timeout=PUBLISH_TIMEOUT_S)


class PublishDeadLetters(beam.PTransform):
    """Publish each `DeadLetter` to ``topic`` (``projects/P/topics/T``) as a JSON message."""

    def __init__(self, topic: str, publisher_factory: Callable[[], Any] | None = None) -> None:
        super().__init__()
        if not topic:
            msg = "PublishDeadLetters needs a topic (projects/P/topics/T), got an empty one"
            raise ValueError(msg)
        self.topic = topic
        self.publisher_factory = publisher_factory

    def expand(self, dead: Any) -> Any:
        return dead | "PublishToPubSub" >> beam.ParDo(
            _PublishFn(self.topic, self.publisher_factory)
        )
