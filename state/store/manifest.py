"""The commit manifest: a small JSON file whose create-if-absent creation is the commit.

It names the immutable data file and records its size and SHA-256, so that a restore checks the
bytes before handing them to the Arrow reader.

Optional (written since the split hash was added; format-1 readers ignore unknown fields and
still check ``sha256``): ``tensor_ranges`` = ``[S offset, S bytes, z offset, z bytes]`` inside the
data file and ``split_sha256`` = ``split_file_hash``: SHA-256 over every byte of the file outside
those ranges plus the content digest, which covers the bytes inside them.  It commits to every
byte of the file like ``sha256`` does, and a reader verifies it and the content digest in one
pass over the tensor bytes instead of two.

Format 2 adds ``history`` (see ``History``): the commit's number in the sequence's chain, the
position of its parent commit, the final chunk when it has been applied, the content digests of
the last applied chunks, and the output span the commit finalizes; and ``check``, the SHA-256 of
the manifest's canonical JSON without it (a flipped bit in a format-2 manifest is detected, not
trusted).  Manifests are untrusted input like data files:
``Manifest.parse`` checks every field's type and range, and that the data file name is a plain
name (no path) in the expected form; the JSON itself is parsed with size, nesting-depth and
number-length limits (``safe_json.loads_bounded``), so no manifest raises anything but a
``CheckpointError``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from linstream.state.codec import check_format_version
from linstream.state.errors import CorruptCheckpointError, UnsupportedFormatVersionError

from .paths import data_name, data_name_commit, parse_data_name
from .safe_json import UnsafeJSONError, loads_bounded

__all__ = [
    "DIGEST_BYTES",
    "MAX_DIGESTS",
    "MAX_MANIFEST_BYTES",
    "History",
    "Manifest",
    "OutputSpan",
    "split_file_hash",
]

MAX_MANIFEST_BYTES = 64 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_DATA_BYTES = 1 << 40
#: Bytes of one chunk's content digest, and how many of the newest applied chunks keep one.
DIGEST_BYTES = 16
MAX_DIGESTS = 1024
_MAX_URL = 4096
_MAX_SUM_BYTES = 8 * 4096
_I63 = 2**63


@dataclass(frozen=True)
class OutputSpan:
    """The outputs a commit finalizes: chunks ``first_chunk .. end_chunk - 1`` of the sequence,
    written to ``pending`` (a hidden name) before the commit and published as ``file`` after it.
    ``sha256``/``size`` are those of the file's bytes (a roll-forward checks them)."""

    file: str
    pending: str
    first_chunk: int
    end_chunk: int
    rows: int
    size: int
    sha256: str


@dataclass(frozen=True)
class History:
    """What format 2 records about a sequence's history at a commit."""

    commit: int
    parent_position: int
    final_chunk: int  # -1: the final chunk has not been applied
    digests: bytes  # DIGEST_BYTES per chunk, for chunks next_chunk - n .. next_chunk - 1
    outputs: OutputSpan | None = None
    #: float64 sum of the per-token outputs so far (``emit="sequence"``), little-endian bytes
    output_sum: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "parent_position": self.parent_position,
            "final_chunk": self.final_chunk,
            "digests": base64.b64encode(self.digests).decode("ascii"),
            "outputs": None if self.outputs is None else asdict(self.outputs),
            "output_sum": base64.b64encode(self.output_sum).decode("ascii"),
        }


def _check_of(fields: dict[str, Any]) -> str:
    body = json.dumps(fields, sort_keys=True, ensure_ascii=True).encode("ascii")
    return hashlib.sha256(b"linstream.manifest.v2\x00" + body).hexdigest()


@dataclass(frozen=True)
class Manifest:
    format_version: int
    min_reader_version: int
    seq_id: str
    position: int
    next_chunk: int
    fingerprint: str
    dtype: str
    shape: tuple[int, int, int, int]
    data_file: str
    size: int
    sha256: str
    digest: str
    tensor_ranges: tuple[int, int, int, int] | None = None
    split_sha256: str | None = None
    history: History | None = None

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, ASCII): equal commits give byte-equal manifests."""
        fields = asdict(self)
        fields["shape"] = list(self.shape)
        if self.tensor_ranges is None or self.split_sha256 is None:
            del fields["tensor_ranges"], fields["split_sha256"]
        else:
            fields["tensor_ranges"] = list(self.tensor_ranges)
        del fields["history"]
        if self.history is not None:
            fields["history"] = self.history.to_json()
            fields["check"] = _check_of(fields)
        return (json.dumps(fields, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")

    @classmethod
    def parse(cls, raw: bytes, *, path: str, position: int | None = None) -> Manifest:
        """Parse and check ``raw``; format version first.  Raises ``CheckpointError``s."""

        def bad(why: str) -> CorruptCheckpointError:
            return CorruptCheckpointError(f"manifest {why}", path=path)

        if len(raw) == 0:
            msg = "is empty (a crash while it was written?)"
            raise bad(msg)
        if len(raw) > MAX_MANIFEST_BYTES:
            msg = f"is larger than {MAX_MANIFEST_BYTES} bytes"
            raise bad(msg)
        try:
            obj: Any = loads_bounded(raw, max_bytes=MAX_MANIFEST_BYTES)
        except UnsafeJSONError as ex:
            msg = f"is refused unparsed ({len(raw)} bytes): {ex}"
            raise bad(msg) from ex
        except (UnicodeDecodeError, json.JSONDecodeError) as ex:
            msg = f"is not complete JSON ({len(raw)} bytes): {ex}"
            raise bad(msg) from ex
        if not isinstance(obj, dict):
            msg = f"expected a JSON object, received {type(obj).__name__}"
            raise bad(msg)

        def get(key: str, typ: type) -> Any:
            value = obj.get(key)
            if not isinstance(value, typ) or isinstance(value, bool):
                msg = f"field {key!r}: expected {typ.__name__}, received {value!r:.80}"
                raise bad(msg)
            return value

        found, min_reader = get("format_version", int), get("min_reader_version", int)
        try:
            check_format_version(found, min_reader)
        except UnsupportedFormatVersionError as ex:
            raise ex.at(path) from None
        shape = get("shape", list)
        if len(shape) != 4 or not all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1 << 24 for n in shape
        ):
            msg = f"field 'shape': expected 4 dimensions >= 1, received {shape!r:.80}"
            raise bad(msg)
        m = cls(
            format_version=found,
            min_reader_version=min_reader,
            seq_id=get("seq_id", str),
            position=get("position", int),
            next_chunk=get("next_chunk", int),
            fingerprint=get("fingerprint", str),
            dtype=get("dtype", str),
            shape=(shape[0], shape[1], shape[2], shape[3]),
            data_file=get("data_file", str),
            size=get("size", int),
            sha256=get("sha256", str),
            digest=get("digest", str),
        )
        if not 0 <= m.position < 2**63 or not 0 <= m.next_chunk < 2**63:
            msg = f"position/next_chunk out of range: {m.position}, {m.next_chunk}"
            raise bad(msg)
        if position is not None and m.position != position:
            msg = f"records position {m.position}, but its name says {position}"
            raise bad(msg)
        if m.dtype not in ("float64", "float32"):
            msg = f"field 'dtype': expected float64 or float32, received {m.dtype!r:.40}"
            raise bad(msg)
        if not _HEX64.fullmatch(m.sha256):
            msg = "field 'sha256': expected 64 lowercase hex digits"
            raise bad(msg)
        named_commit = data_name_commit(m.data_file)
        if parse_data_name(m.data_file) != m.position or m.data_file != data_name(
            m.position, m.sha256, named_commit
        ):
            msg = f"field 'data_file': unexpected name {m.data_file!r:.80}"
            raise bad(msg)
        if not 0 < m.size <= _MAX_DATA_BYTES:
            msg = f"field 'size': expected 1..{_MAX_DATA_BYTES}, received {m.size}"
            raise bad(msg)
        if "tensor_ranges" in obj or "split_sha256" in obj:
            ranges = get("tensor_ranges", list)
            split = get("split_sha256", str)
            if not _HEX64.fullmatch(split):
                msg = "field 'split_sha256': expected 64 lowercase hex digits"
                raise bad(msg)
            if len(ranges) != 4 or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in ranges
            ):
                msg = f"field 'tensor_ranges': expected 4 integers >= 0, received {ranges!r:.80}"
                raise bad(msg)
            s_off, s_len, z_off, z_len = ranges
            item = 8 if m.dtype == "float64" else 4
            L, H, F, dv = m.shape
            if not (
                s_len == L * H * F * dv * item
                and z_len == L * H * F * item
                and s_off + s_len <= z_off
                and z_off + z_len <= m.size
            ):
                msg = (
                    f"field 'tensor_ranges': {ranges} do not fit shape {list(m.shape)}, dtype "
                    f"{m.dtype} and size {m.size}"
                )
                raise bad(msg)
            m = replace(m, tensor_ranges=(s_off, s_len, z_off, z_len), split_sha256=split)
        if "history" in obj or "check" in obj or m.format_version >= 2:
            m = replace(m, history=_parse_history(obj, m, bad))
        if named_commit is not None and (m.history is None or m.history.commit != named_commit):
            msg = f"field 'data_file': {m.data_file!r:.80} names another commit"
            raise bad(msg)
        return m


def _int_in(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value < hi


def _parse_history(obj: dict[str, Any], m: Manifest, bad: Any) -> History:
    """The format-2 ``history`` of a parsed manifest object, checked against ``check``."""
    check = obj.get("check")
    if not isinstance(check, str) or not _HEX64.fullmatch(check):
        msg = "field 'check': expected 64 lowercase hex digits"
        raise bad(msg)
    body = {k: v for k, v in obj.items() if k != "check"}
    if _check_of(body) != check:
        msg = "check sum does not match its content (damaged or edited)"
        raise bad(msg)
    h = obj.get("history")
    if not isinstance(h, dict):
        msg = f"field 'history': expected an object, received {h!r:.80}"
        raise bad(msg)
    commit: Any = h.get("commit")
    parent: Any = h.get("parent_position")
    final: Any = h.get("final_chunk")
    if not _int_in(commit, 1, _I63) or not _int_in(parent, 0, _I63) or parent >= max(m.position, 1):
        msg = f"field 'history': commit {commit!r:.30} / parent position {parent!r:.30} invalid"
        raise bad(msg)
    if not _int_in(final, -1, m.next_chunk):
        msg = f"field 'history': final chunk {final!r:.30} is not below next chunk {m.next_chunk}"
        raise bad(msg)
    raw = h.get("digests")
    try:
        digests = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
    except (binascii.Error, ValueError):
        digests = None
    if (
        digests is None
        or len(digests) % DIGEST_BYTES
        or len(digests) // DIGEST_BYTES > min(MAX_DIGESTS, m.next_chunk)
    ):
        msg = "field 'history': digests are not a whole number of chunk digests"
        raise bad(msg)
    raw_sum = h.get("output_sum", "")
    try:
        total = base64.b64decode(raw_sum, validate=True) if isinstance(raw_sum, str) else None
    except (binascii.Error, ValueError):
        total = None
    if total is None or len(total) % 8 or len(total) > _MAX_SUM_BYTES:
        msg = "field 'history': output_sum is not a float64 vector"
        raise bad(msg)
    return History(commit, parent, final, digests, _parse_span(h.get("outputs"), m, bad), total)


def _parse_span(o: Any, m: Manifest, bad: Any) -> OutputSpan | None:
    if o is None:
        return None
    keys = ("file", "pending", "first_chunk", "end_chunk", "rows", "size", "sha256")
    if not isinstance(o, dict) or set(o) != set(keys):
        msg = f"field 'history.outputs': expected the keys {list(keys)}"
        raise bad(msg)
    ok = (
        all(isinstance(o[k], str) and 0 < len(o[k]) <= _MAX_URL for k in ("file", "pending"))
        and _int_in(o["first_chunk"], 0, m.next_chunk)
        and o["end_chunk"] == m.next_chunk
        and _int_in(o["rows"], 1, _I63)
        and _int_in(o["size"], 1, _MAX_DATA_BYTES)
        and isinstance(o["sha256"], str)
        and _HEX64.fullmatch(o["sha256"]) is not None
    )
    if not ok:
        msg = f"field 'history.outputs': invalid span {o!r:.120}"
        raise bad(msg)
    return OutputSpan(**o)


def split_file_hash(data: Any, ranges: tuple[int, int, int, int], digest: str) -> str:
    """SHA-256 over the data file with its S and z byte ranges replaced by the content digest
    (which hashes exactly those bytes): a commitment to every byte of the file."""
    s_off, s_len, z_off, z_len = ranges
    view = memoryview(data).cast("B")
    h = hashlib.sha256(b"linstream.split.v1\x00")
    h.update(f"{len(view)},{s_off},{s_len},{z_off},{z_len}\x00".encode("ascii"))
    h.update(view[:s_off])
    h.update(view[s_off + s_len : z_off])
    h.update(view[z_off + z_len :])
    h.update(digest.encode("ascii"))
    return h.hexdigest()
