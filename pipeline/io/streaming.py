"""Unbounded chunk sources for `linstream embed --streaming`: Pub/Sub (Dataflow) and Kafka.

    chunks = read_stream_chunks(pipeline, config)                     # PCollection[Chunk]
    chunks, dead = read_stream_chunks(pipeline, config, with_dead_letters=True)

`config` is a `StreamConfig` (reader_config.py; its fields are the options `add_streaming_args`
adds): exactly one source, `--pubsub_subscription` or `--pubsub_topic` (Beam's `ReadFromPubSub`;
Dataflow, or a runner with a Pub/Sub emulator) or `--kafka_bootstrap` with `--kafka_topic`
(Beam's cross-language `ReadFromKafka`: the Java expansion service and a Java SDK harness must be
reachable, e.g. Dataflow runner v2 or Flink with Docker).

Message formats (one message carries one chunk; an Arrow message may carry several rows):

* **JSON** (UTF-8 object): ``{"seq_id": "s1", "chunk_index": 0, "final": false,
  "tokens": [17, 4, 256]}`` or, for a feature model, ``"features": [[0.1, 0.2], [0.3, 0.4]]``
  (T rows of input_dim floats). ``final`` is optional (default false).
* **Arrow IPC** (stream or file format): record batches with the chunk-file schema of
  `linstream.pipeline.io.chunk_schema` — ``seq_id`` string, ``chunk_index`` int64, ``final``
  bool, and ``tokens`` list<int32> or ``features`` list<fixed_size_list<float32, input_dim>>.
  Each row is a chunk. This is the same schema as the Parquet input files.

The format is taken from the Pub/Sub attribute ``content-type`` (``application/json`` or
``application/vnd.apache.arrow.stream`` / ``.file``) when present, else sniffed from the first
bytes (``{`` for JSON; the Arrow stream continuation marker or ``ARROW1`` for Arrow).

Keys: a Kafka record's key, and a Pub/Sub ``seq_id`` attribute, are optional; when present they
must equal the payload's ``seq_id`` (a JSON payload may leave ``seq_id`` out and take the key's).
Produce with key = seq_id (Kafka) or ordering key = seq_id (Pub/Sub) so one sequence's chunks
mostly stay in order; the stateful stage reorders and de-duplicates anyway.

Element timestamps: Pub/Sub publish time, or the attribute named by `--pubsub_timestamp_attribute`;
Kafka: the consumer's processing time (`ReadFromKafka`'s default policy).  The stage's idle timer
runs in event time, so these decide when an idle sequence is committed and evicted.

A message that cannot be decoded (not UTF-8 JSON or Arrow, JSON nested too deeply or with an integer
too long to convert, a token id or chunk index beyond 64 bits, a missing or mistyped field, a key
that disagrees with its payload, or anything else the decoder raises on) never fails the bundle:
it becomes a `DeadLetter` with reason ``undecodable_message``, ``bad_message`` or ``key_mismatch``
and is counted under the metrics
namespace ``linstream`` (``stream_messages``, ``stream_chunks``, ``stream_dead_letters``).  Value
checks (NaN, empty chunk, unknown token id, negative index) stay with the stateful stage, which
dead-letters them with the same reasons as for file input.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from linstream.pipeline.elements import Chunk, DeadLetter

from . import table_to_chunks
from .reader_config import StreamConfig

__all__ = [
    "ARROW_FILE_CONTENT_TYPE",
    "ARROW_STREAM_CONTENT_TYPE",
    "JSON_CONTENT_TYPE",
    "BadMessage",
    "DecodeStreamMessages",
    "StreamConfig",
    "StreamSourceError",
    "add_streaming_args",
    "decode_message",
    "kafka_read_transform",
    "read_stream_chunks",
    "source_kind",
]

JSON_CONTENT_TYPE = "application/json"
ARROW_STREAM_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
ARROW_FILE_CONTENT_TYPE = "application/vnd.apache.arrow.file"

_NAMESPACE = "linstream"
_DEAD = "dead_letters"
_ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"
_ARROW_FILE_MAGIC = b"ARROW1"
_PREVIEW = 48
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_log = logging.getLogger(__name__)


class StreamSourceError(ValueError):
    """The streaming options name no source, two sources, or an incomplete one."""


# -- options ---------------------------------------------------------------------------------


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


# -- decoding ---------------------------------------------------------------------------------


class BadMessage(ValueError):
    """A message that is not a chunk: `.reason` (a dead-letter reason), `.message`, and the
    `.seq_id` / `.index` it claimed, as far as they could be read."""

    def __init__(
        self, message: str, *, reason: str, seq_id: str = "", index: int | None = None
    ) -> None:
        super().__init__(message)
        self.reason, self.message, self.seq_id, self.index = reason, message, seq_id, index


def _preview(data: bytes) -> str:
    head = data[:_PREVIEW]
    more = "..." if len(data) > _PREVIEW else ""
    return f"{head!r}{more} ({len(data)} bytes)"


def _format_of(data: bytes, content_type: str | None) -> str:
    if content_type:
        ct = content_type.split(";", 1)[0].strip().lower()
        if ct in (JSON_CONTENT_TYPE, "text/json"):
            return "json"
        if ct in (ARROW_STREAM_CONTENT_TYPE, ARROW_FILE_CONTENT_TYPE):
            return "arrow"
        msg = (
            f"content-type {content_type!r} is not {JSON_CONTENT_TYPE}, "
            f"{ARROW_STREAM_CONTENT_TYPE} or {ARROW_FILE_CONTENT_TYPE}"
        )
        raise BadMessage(msg, reason="undecodable_message")
    if data.startswith((_ARROW_STREAM_MAGIC, _ARROW_FILE_MAGIC)):
        return "arrow"
    if data.lstrip()[:1] == b"{":
        return "json"
    msg = f"expected a JSON object or Arrow IPC bytes, got {_preview(data)}"
    raise BadMessage(msg, reason="undecodable_message")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_utf8(s: str) -> bool:
    """False for strings holding lone surrogates (JSON ``"\\ud800"``): no UTF-8 form."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_payload(obj: Mapping[str, Any], seq_id: str, index: int) -> np.ndarray:
    has_t, has_f = "tokens" in obj, "features" in obj
    if has_t == has_f:
        msg = "expected exactly one of 'tokens' or 'features'" + (
            ", got both" if has_t else f", got keys {sorted(obj)}"
        )
        raise BadMessage(msg, reason="bad_message", seq_id=seq_id, index=index)
    if has_t:
        toks = obj["tokens"]
        if not isinstance(toks, list) or not all(_is_int(t) for t in toks):
            msg = f"'tokens' must be a list of integers, got {_short_json(toks)}"
            raise BadMessage(msg, reason="bad_message", seq_id=seq_id, index=index)
        big = next((t for t in toks if not _INT64_MIN <= t <= _INT64_MAX), None)
        if big is not None:
            msg = f"'tokens' must be 64-bit integers, got {_short_int(big)}"
            raise BadMessage(msg, reason="bad_message", seq_id=seq_id, index=index)
        arr = np.array(toks, dtype=np.int64)
        # int32 like the Parquet path; ids beyond it stay int64 and the stage names them.
        if arr.size == 0 or (arr.min() >= -(2**31) and arr.max() < 2**31):
            return arr.astype(np.int32)
        return arr
    feats = obj["features"]
    ok = isinstance(feats, list) and all(
        isinstance(row, list)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in row)
        for row in feats
    )
    if not ok:
        msg = f"'features' must be a list of rows of numbers, got {_short_json(feats)}"
        raise BadMessage(msg, reason="bad_message", seq_id=seq_id, index=index)
    widths = {len(row) for row in feats}
    if len(widths) > 1:
        msg = f"'features' rows must have one width, got widths {sorted(widths)}"
        raise BadMessage(msg, reason="bad_message", seq_id=seq_id, index=index)
    width = widths.pop() if widths else 0
    try:
        return np.array(feats, dtype=np.float32).reshape(len(feats), width)
    except OverflowError as ex:  # an integer beyond the float range (10**400)
        msg = f"'features' must be numbers in the float range: {ex}"
        raise BadMessage(msg, reason="bad_message", seq_id=seq_id, index=index) from ex


def _short_json(value: Any) -> str:
    """At most 80 characters of ``value`` as JSON (integers beyond str() limits elided)."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = f"a {type(value).__name__} too large or deep to show"
    return text[:80]


def _short_int(n: int) -> str:
    if abs(n) < 10**30:
        return str(n)
    return f"an integer of about {n.bit_length()} bits"


def _decode_json(data: bytes, key: str | None) -> list[Chunk]:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        msg = f"not UTF-8 JSON ({ex}): {_preview(data)}"
        raise BadMessage(msg, reason="undecodable_message", seq_id=key or "") from ex
    except RecursionError as ex:
        msg = f"JSON nested too deeply to decode: {_preview(data)}"
        raise BadMessage(msg, reason="undecodable_message", seq_id=key or "") from ex
    except ValueError as ex:  # e.g. an integer literal longer than Python converts (4300 digits)
        msg = f"JSON with a value Python cannot convert ({ex}): {_preview(data)}"
        raise BadMessage(msg, reason="undecodable_message", seq_id=key or "") from ex
    if not isinstance(obj, dict):
        msg = f"expected a JSON object, got {type(obj).__name__}"
        raise BadMessage(msg, reason="bad_message", seq_id=key or "")
    seq_id = obj.get("seq_id", key)
    if not isinstance(seq_id, str) or not seq_id or not _is_utf8(seq_id):
        msg = (
            "'seq_id' must be a non-empty UTF-8 string (or come from the key), got "
            f"{_short_json(seq_id)}"
        )
        raise BadMessage(msg, reason="bad_message", seq_id=key or "")
    index = obj.get("chunk_index")
    if not isinstance(index, int) or isinstance(index, bool):
        msg = f"'chunk_index' must be an integer, got {_short_json(index)}"
        raise BadMessage(msg, reason="bad_message", seq_id=seq_id)
    if not _INT64_MIN <= index <= _INT64_MAX:
        msg = f"'chunk_index' must be a 64-bit integer, got {_short_int(index)}"
        raise BadMessage(msg, reason="bad_message", seq_id=seq_id)
    final = obj.get("final", False)
    if not isinstance(final, bool):
        msg = f"'final' must be true or false, got {_short_json(final)}"
        raise BadMessage(msg, reason="bad_message", seq_id=seq_id, index=index)
    return [Chunk(seq_id, index, _json_payload(obj, seq_id, index), final)]


def _decode_arrow(data: bytes, key: str | None) -> list[Chunk]:
    try:
        if data.startswith(_ARROW_FILE_MAGIC):
            table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        else:
            table = pa.ipc.open_stream(io.BytesIO(data)).read_all()
    except (pa.ArrowInvalid, OSError) as ex:
        msg = f"not readable as Arrow IPC ({ex}): {_preview(data)}"
        raise BadMessage(msg, reason="undecodable_message", seq_id=key or "") from ex
    names = set(table.column_names)
    missing = {"seq_id", "chunk_index"} - names
    if missing:
        msg = f"Arrow message lacks column(s) {sorted(missing)}; has {sorted(names)}"
        raise BadMessage(msg, reason="bad_message", seq_id=key or "")
    if not pa.types.is_string(table.schema.field("seq_id").type) or not pa.types.is_integer(
        table.schema.field("chunk_index").type
    ):
        msg = (
            "Arrow columns seq_id: string and chunk_index: int64 expected, got "
            f"{table.schema.field('seq_id').type} and {table.schema.field('chunk_index').type}"
        )
        raise BadMessage(msg, reason="bad_message", seq_id=key or "")
    if table.num_rows == 0:
        msg = "Arrow message has no rows"
        raise BadMessage(msg, reason="bad_message", seq_id=key or "")
    if table.column("seq_id").null_count or table.column("chunk_index").null_count:
        msg = "Arrow message has a null seq_id or chunk_index"
        raise BadMessage(msg, reason="bad_message", seq_id=key or "")
    return list(table_to_chunks(table))


def decode_message(
    data: bytes, *, key: str | None = None, content_type: str | None = None
) -> list[Chunk]:
    """Chunks from one message's bytes; raises `BadMessage` (.reason, .message) when it is bad.

    key: the Kafka record key or Pub/Sub ``seq_id`` attribute (UTF-8), if any; every chunk's
    seq_id must equal it.
    """
    try:
        fmt = _format_of(data, content_type)
        chunks = _decode_json(data, key) if fmt == "json" else _decode_arrow(data, key)
    except BadMessage:
        raise
    except Exception as ex:  # anything else a hostile message can provoke is its fault too
        msg = f"could not decode ({type(ex).__name__}: {str(ex)[:120]}): {_preview(data)}"
        raise BadMessage(msg, reason="undecodable_message", seq_id=key or "") from ex
    if key is not None:
        for c in chunks:
            if c.seq_id != key:
                msg = f"message key {key!r} differs from the payload's seq_id {c.seq_id!r}"
                raise BadMessage(msg, reason="key_mismatch", seq_id=c.seq_id, index=c.index)
    return chunks


def _to_key(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        if not raw:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as ex:
            msg = f"key is not UTF-8: {_preview(raw)}"
            raise BadMessage(msg, reason="undecodable_message") from ex
    return str(raw) or None


class _DecodeDoFn(beam.DoFn):
    """Raw messages -> `Chunk`s; bad messages -> `DeadLetter`s on the `dead_letters` output."""

    def __init__(self, kind: str) -> None:
        if kind not in ("pubsub", "kafka", "bytes"):
            msg = f"kind must be 'pubsub', 'kafka' or 'bytes', got {kind!r}"
            raise ValueError(msg)
        self.kind = kind
        self.messages = Metrics.counter(_NAMESPACE, "stream_messages")
        self.chunks = Metrics.counter(_NAMESPACE, "stream_chunks")
        self.dead = Metrics.counter(_NAMESPACE, "stream_dead_letters")

    def _unpack(self, element: Any) -> tuple[bytes, str | None, str | None]:
        """(payload, key, content type) of a Pub/Sub message, Kafka (key, value) or bytes."""
        if self.kind == "kafka":
            try:
                raw_key, value = element
            except (TypeError, ValueError) as ex:
                msg = f"expected a Kafka (key, value) pair, got {type(element).__name__}"
                raise BadMessage(msg, reason="undecodable_message") from ex
            return bytes(value or b""), _to_key(raw_key), None
        if self.kind == "pubsub" and hasattr(element, "data"):
            attrs = element.attributes or {}
            ctype = attrs.get("content-type") or attrs.get("content_type")
            return bytes(element.data or b""), _to_key(attrs.get("seq_id")), ctype
        if isinstance(element, bytes | bytearray):
            return bytes(element), None, None
        msg = f"expected message bytes, got {type(element).__name__}"
        raise BadMessage(msg, reason="undecodable_message")

    def process(self, element: Any) -> Iterator[Any]:
        self.messages.inc()
        try:
            try:
                data, key, ctype = self._unpack(element)
                chunks = decode_message(data, key=key, content_type=ctype)
            except BadMessage:
                raise
            except Exception as ex:  # a message never fails its bundle, whatever it holds
                msg = f"could not decode ({type(ex).__name__}: {str(ex)[:120]})"
                raise BadMessage(msg, reason="undecodable_message") from ex
        except BadMessage as r:
            self.dead.inc()
            yield beam.pvalue.TaggedOutput(
                _DEAD,
                DeadLetter(r.seq_id, r.index, r.reason, f"{self.kind} message: {r.message}"),
            )
            return
        self.chunks.inc(len(chunks))
        yield from chunks


class DecodeStreamMessages(beam.PTransform):
    """Decode raw stream messages into `Chunk`s (main output) and `DeadLetter`s.

    kind: ``"pubsub"`` (`PubsubMessage`s, or bytes), ``"kafka"`` ((key, value) byte pairs) or
    ``"bytes"``.  Applying it returns ``(chunks, dead_letters)``.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self._dofn = _DecodeDoFn(kind)

    def expand(self, messages: Any) -> tuple[Any, Any]:
        out = messages | "Decode" >> beam.ParDo(self._dofn).with_outputs(_DEAD, main="chunks")
        chunks, dead = out.chunks, out[_DEAD]
        chunks.element_type = Chunk
        dead.element_type = DeadLetter
        return chunks, dead


# -- sources ----------------------------------------------------------------------------------


def _read_pubsub(pipeline: Any, config: StreamConfig) -> Any:
    return pipeline | "ReadPubSub" >> beam.io.ReadFromPubSub(
        topic=config.pubsub_topic,
        subscription=config.pubsub_subscription,
        with_attributes=True,
        timestamp_attribute=config.pubsub_timestamp_attribute,
    )


def kafka_read_transform(config: StreamConfig) -> Any:
    """The `ReadFromKafka` transform ``config`` describes (built, not yet expanded)."""
    from apache_beam.io.kafka import ReadFromKafka

    topics = [t.strip() for t in str(config.kafka_topic).split(",") if t.strip()]
    return ReadFromKafka(
        consumer_config={
            "bootstrap.servers": str(config.kafka_bootstrap),
            "group.id": str(config.kafka_group_id or "linstream"),
            "auto.offset.reset": "earliest",
        },
        topics=topics,
        commit_offset_in_finalize=True,
        expansion_service=config.kafka_expansion_service,
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
