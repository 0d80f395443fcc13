"""What an Arrow IPC file's record batches claim, read before Arrow allocates anything for them.

An IPC body may be compressed (LZ4 or ZSTD, per buffer): each buffer then starts with the length
it decompresses to, and Arrow allocates that length when it reads the batch.  A 36 KB file can so
make a reader allocate gigabytes.  ``batch_claims`` reads the file's footer and each record
batch's message header (FlatBuffers tables, read here with bounds checks on every offset) and
returns, per batch, its row count, body size, compression and the decoded bytes its buffers
claim.  ``check_state_file_bounds`` applies linstream's rule to a state file: state files are
written uncompressed, so a compressed body is refused before any buffer is decompressed, and every
buffer must lie inside its body.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .errors import StateBoundsError

__all__ = ["BatchClaims", "batch_claims", "check_state_file_bounds"]

_MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH = 3  # MessageHeader union tag


class _Malformed(Exception):
    pass


class _Table:
    """One FlatBuffers table inside ``buf`` (every read checks its bounds)."""

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos
        vt = pos - _unpack(buf, "<i", pos)
        vt_len = _unpack(buf, "<H", vt)
        if vt_len < 4 or vt_len % 2:
            msg = f"vtable of {vt_len} bytes"
            raise _Malformed(msg)
        self.vt, self.n_fields = vt, (vt_len - 4) // 2

    def _field(self, i: int) -> int | None:
        if i >= self.n_fields:
            return None
        off = _unpack(self.buf, "<H", self.vt + 4 + 2 * i)
        return self.pos + off if off else None

    def scalar(self, i: int, fmt: str, default: int = 0) -> int:
        at = self._field(i)
        return default if at is None else _unpack(self.buf, fmt, at)

    def table(self, i: int) -> _Table | None:
        at = self._field(i)
        return None if at is None else _Table(self.buf, at + _unpack(self.buf, "<I", at))

    def vector(self, i: int, item: int) -> tuple[int, int]:
        """(start, count) of a vector of ``item``-byte structs (count 0 when absent)."""
        at = self._field(i)
        if at is None:
            return 0, 0
        vec = at + _unpack(self.buf, "<I", at)
        n = _unpack(self.buf, "<I", vec)
        if vec + 4 + n * item > len(self.buf):
            msg = f"vector of {n} items past the end"
            raise _Malformed(msg)
        return vec + 4, n


def _unpack(buf: memoryview, fmt: str, at: int) -> int:
    size = struct.calcsize(fmt)
    if at < 0 or at + size > len(buf):
        msg = f"offset {at} outside {len(buf)} bytes"
        raise _Malformed(msg)
    return int(struct.unpack_from(fmt, buf, at)[0])


@dataclass(frozen=True)
class BatchClaims:
    """One record batch as its header describes it."""

    rows: int
    body_bytes: int
    compression: int | None  # None: uncompressed; else the CompressionType code (0 LZ4, 1 ZSTD)
    decoded_bytes: int  # what its buffers decode to (stored lengths when uncompressed)


def batch_claims(data: Any) -> list[BatchClaims]:
    """The record batches of the IPC file ``data`` as their headers claim them.

    Raises ``ValueError`` for a file whose footer or headers do not parse, or whose buffers do
    not lie inside their bodies; reads only metadata, allocates nothing in proportion to claims.
    """
    buf = memoryview(data).cast("B")
    n = len(buf)
    try:
        if n < 2 * len(_MAGIC) + 4 or bytes(buf[-6:]) != _MAGIC or bytes(buf[:6]) != _MAGIC:
            msg = "no ARROW1 magic at both ends"
            raise _Malformed(msg)
        footer_len = _unpack(buf, "<i", n - 10)
        start = n - 10 - footer_len
        if footer_len <= 0 or start < 8:
            msg = f"footer length {footer_len}"
            raise _Malformed(msg)
        footer_buf = buf[start : n - 10]
        footer = _Table(footer_buf, _unpack(footer_buf, "<I", 0))
        _, n_dicts = footer.vector(2, 24)
        if n_dicts:
            msg = f"{n_dicts} dictionary batches (a state file has none)"
            raise _Malformed(msg)
        first, n_batches = footer.vector(3, 24)
        return [_claims(buf, footer_buf, first + 24 * i) for i in range(n_batches)]
    except _Malformed as ex:
        msg = f"Arrow IPC metadata does not parse: {ex}"
        raise ValueError(msg) from None


def _claims(buf: memoryview, footer: memoryview, block: int) -> BatchClaims:
    offset = _unpack(footer, "<q", block)
    meta_len = _unpack(footer, "<i", block + 8)
    body_len = _unpack(footer, "<q", block + 16)
    if offset < 8 or meta_len < 8 or body_len < 0 or offset + meta_len + body_len > len(buf):
        msg = f"block at {offset} (+{meta_len}+{body_len}) outside the file"
        raise _Malformed(msg)
    at = offset
    if _unpack(buf, "<I", at) == _CONTINUATION:
        at += 4
    fb_len = _unpack(buf, "<i", at)
    fb_start = at + 4
    if fb_len <= 0 or fb_start + fb_len > offset + meta_len:
        msg = f"message header of {fb_len} bytes at {at}"
        raise _Malformed(msg)
    fb = buf[fb_start : fb_start + fb_len]
    message = _Table(fb, _unpack(fb, "<I", 0))
    if message.scalar(1, "<B") != _RECORD_BATCH:
        msg = "a record batch block holds another message type"
        raise _Malformed(msg)
    if message.scalar(3, "<q") != body_len:
        msg = f"message body {message.scalar(3, '<q')} != block body {body_len}"
        raise _Malformed(msg)
    batch = message.table(2)
    if batch is None:
        msg = "record batch message without a header"
        raise _Malformed(msg)
    rows = batch.scalar(0, "<q")
    compression = batch.table(3)
    codec = None if compression is None else compression.scalar(0, "<b")
    body = offset + meta_len
    first, n_buffers = batch.vector(2, 16)
    decoded = 0
    for i in range(n_buffers):
        b_off = _unpack(fb, "<q", first + 16 * i)
        b_len = _unpack(fb, "<q", first + 16 * i + 8)
        if b_off < 0 or b_len < 0 or b_off + b_len > body_len:
            msg = f"buffer {i} ({b_off}+{b_len}) outside a body of {body_len} bytes"
            raise _Malformed(msg)
        if codec is None or b_len == 0:
            decoded += b_len
            continue
        if b_len < 8:
            msg = f"compressed buffer {i} of {b_len} bytes has no length prefix"
            raise _Malformed(msg)
        claimed = _unpack(buf, "<q", body + b_off)
        decoded += b_len - 8 if claimed == -1 else max(claimed, 0)
    return BatchClaims(rows, body_len, codec, decoded)


def check_state_file_bounds(data: Any, *, shape: tuple[int, ...], itemsize: int) -> None:
    """Refuse (``StateBoundsError``) a state file whose record batches would make Arrow allocate
    memory the file does not hold, before Arrow reads any batch: a compressed body (linstream
    writes state files uncompressed, so nothing is ever decompressed: what a buffer claims is
    compared with what S of ``shape`` and its z take, for the message), or a batch of other than
    one row.  Uncompressed buffers lie inside the file (``batch_claims`` checks it), so they
    cost no allocation.  A ValueError from ``batch_claims`` is left to the caller."""
    tensors = itemsize
    for dim in shape:
        tensors *= dim
    tensors += tensors // max(shape[-1], 1) if shape else 0
    for i, c in enumerate(batch_claims(data)):
        if c.compression is not None:
            msg = (
                f"record batch {i} is compressed (codec {c.compression}): its {c.body_bytes} "
                f"bytes claim {c.decoded_bytes} decoded bytes for tensors of {tensors} bytes "
                f"(shape {list(shape)}); linstream writes state files uncompressed and never "
                "decompresses one (refused before allocating)"
            )
            raise StateBoundsError(msg)
        if c.rows != 1:
            msg = f"record batch {i} claims {c.rows} rows; a state file holds 1"
            raise StateBoundsError(msg)
