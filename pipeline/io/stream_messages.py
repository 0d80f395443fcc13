"""Stream messages -> chunks: the message formats of `linstream embed --streaming` (Pub/Sub and
Kafka alike), decoded by `decode_message` and, in a pipeline, by `DecodeStreamMessages`.

One message carries one chunk; an Arrow message may carry several rows:

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

import io
import json
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from linstream.pipeline.elements import Chunk, DeadLetter

from . import table_to_chunks

__all__ = [
    "ARROW_FILE_CONTENT_TYPE",
    "ARROW_STREAM_CONTENT_TYPE",
    "JSON_CONTENT_TYPE",
    "BadMessage",
    "DecodeStreamMessages",
    "decode_message",
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
    except BadMessage as bad:
        bad.seq_id = bad.seq_id or key or ""  # the dead letter names the key's sequence
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

    # `-> Any`: Beam takes an `expand`'s return annotation as the transform's output type hint,
    # which can only be one PCollection (it warns on a tuple of two and drops the hint).
    def expand(self, messages: Any) -> Any:
        out = messages | "Decode" >> beam.ParDo(self._dofn).with_outputs(_DEAD, main="chunks")
        chunks, dead = out.chunks, out[_DEAD]
        chunks.element_type = Chunk
        dead.element_type = DeadLetter
        return chunks, dead
