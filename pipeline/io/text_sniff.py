"""What a text file is here: UTF-8 with no NUL byte, judged on its first 8 KiB (as git and grep
tell text from binary).  `--input-format auto` dead-letters anything else as `not_text`; the
one-line API refuses it.  No Beam here."""

from __future__ import annotations

import codecs

__all__ = ["NOT_TEXT", "SNIFF_BYTES", "not_text_reason"]

#: Dead-letter reason of a file that `--input-format auto` took for text but is not.
NOT_TEXT = "not_text"
#: How much of a file is looked at to tell text from binary.
SNIFF_BYTES = 8192


def not_text_reason(head: bytes) -> str | None:
    """Why the first bytes of a file are not UTF-8 text (a NUL byte, or bytes that are not
    UTF-8), or None.  A multi-byte character cut at the end of ``head`` is not held against it."""
    nul = head.find(b"\0")
    if nul >= 0:
        return f"a NUL byte at offset {nul}"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as ex:
        return f"bytes that are not UTF-8 at offset {ex.start}"
    return None
