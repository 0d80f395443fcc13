"""Bounded JSON parsing for untrusted files (checkpoint manifests).

``json.loads`` recurses once per nesting level (a file nested 30,000 deep raises
``RecursionError``) and converts any integer literal (5,000 digits raise ``ValueError``, and
smaller ones cost quadratic time).  ``loads_bounded`` checks the text first, without recursion:
size, nesting depth and the length of every number token, then parses with hooks that refuse
``NaN``/``Infinity``.  Every refusal is an ``UnsafeJSONError`` (a ``ValueError``) saying which
limit was passed and where.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "UnsafeJSONError", "loads_bounded"]

#: Nesting of objects and arrays allowed (a manifest needs 2).
MAX_DEPTH = 16
#: Characters of one number token (an int64 has at most 20 with its sign).
MAX_NUMBER_CHARS = 40

# Strings (with their escapes) first, so that brackets and digits inside them are skipped.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]|-?[0-9][0-9.eE+-]*')


class UnsafeJSONError(ValueError):
    """JSON refused before parsing: too large, too deep, or a number token too long."""


def _reject_constant(name: str) -> Any:
    msg = f"expected finite numbers, found {name}"
    raise UnsafeJSONError(msg)


def loads_bounded(
    raw: bytes,
    *,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
    max_number_chars: int = MAX_NUMBER_CHARS,
) -> Any:
    """Parse UTF-8 JSON ``raw`` within the limits, else raise ``UnsafeJSONError``.

    Malformed JSON inside the limits raises ``json.JSONDecodeError`` and bad UTF-8
    ``UnicodeDecodeError``, as ``json.loads`` does.
    """
    if len(raw) > max_bytes:
        msg = f"{len(raw)} bytes, more than the {max_bytes} allowed"
        raise UnsafeJSONError(msg)
    text = raw.decode("utf-8")
    depth = 0
    for m in _TOKENS.finditer(raw):
        tok = m.group()
        first = tok[:1]
        if first in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                msg = f"nested deeper than {max_depth} levels (at byte {m.start()})"
                raise UnsafeJSONError(msg)
        elif first in (b"]", b"}"):
            depth -= 1
        elif first != b'"' and len(tok) > max_number_chars:
            msg = (
                f"a number of {len(tok)} characters at byte {m.start()} "
                f"(at most {max_number_chars} allowed)"
            )
            raise UnsafeJSONError(msg)
    return json.loads(text, parse_constant=_reject_constant)
