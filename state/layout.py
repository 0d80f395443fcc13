"""The named tensors a state carries: their names, shapes, and the JSON form files record.

A layout is a tuple of ``(name, shape)`` pairs, each shape starting with the number of layers L:
``S`` [L, H, d_k, d_v] first, ``z`` [L, H, d_k] next when the rule has one, then any others
(an fla model's short-convolution tails ``conv_q`` [L, W−1, D] ...).  The built-in model's and
raw attention's layout is exactly S and z.  Layouts read from files are untrusted: the JSON form
is parsed with bounds on its size, the number of tensors, their names, ranks and sizes.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = [
    "MAX_DIM",
    "MAX_ELEMENTS",
    "MAX_TENSORS",
    "NAME_RE",
    "Layout",
    "check_layout",
    "layout_from_json",
    "layout_to_json",
]

Layout = tuple[tuple[str, tuple[int, ...]], ...]

#: A tensor's name: lowercase letters, digits and underscores, starting with a letter (``S`` is
#: the one capital, kept from the first format).
NAME_RE = re.compile(r"S|[a-z][a-z0-9_]{0,62}")
#: Bounds on what an untrusted layout may declare before anything is computed from it.
MAX_TENSORS = 64
MAX_RANK = 8
MAX_DIM = 1 << 24
MAX_ELEMENTS = 1 << 32
_MAX_JSON = 16 * 1024


def check_layout(layout: Any) -> Layout:
    """``layout`` as a tuple of (name, shape) pairs, checked; ValueError saying what is wrong.

    Rules: 1..MAX_TENSORS tensors with distinct names (``NAME_RE``); ``S`` first, of rank 4;
    ``z`` (if present) second, of shape S[:3]; every shape of rank 1..MAX_RANK with dimensions in
    1..MAX_DIM and the same first dimension (the layers); at most MAX_ELEMENTS values in all."""
    if not isinstance(layout, list | tuple) or not 1 <= len(layout) <= MAX_TENSORS:
        msg = f"layout: expected 1 to {MAX_TENSORS} (name, shape) pairs, received {layout!r:.80}"
        raise ValueError(msg)
    out: list[tuple[str, tuple[int, ...]]] = []
    for item in layout:
        if not isinstance(item, list | tuple) or len(item) != 2:
            msg = f"layout: expected (name, shape) pairs, received {item!r:.80}"
            raise ValueError(msg)
        name, shape = item
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            msg = f"layout: tensor name {name!r:.70} is not a plain lowercase name"
            raise ValueError(msg)
        if any(name == n for n, _ in out):
            msg = f"layout: tensor {name!r} is named twice"
            raise ValueError(msg)
        if (
            not isinstance(shape, list | tuple)
            or not 1 <= len(shape) <= MAX_RANK
            or not all(_dim(n) for n in shape)
        ):
            msg = (
                f"layout: tensor {name!r}: expected a shape of 1 to {MAX_RANK} dimensions in "
                f"1..{MAX_DIM}, received {shape!r:.80}"
            )
            raise ValueError(msg)
        out.append((name, tuple(int(n) for n in shape)))
    names = [n for n, _ in out]
    S = out[0][1]
    if names[0] != "S" or len(S) != 4:
        msg = f"layout: expected S [L, H, d_k, d_v] first, received {names[0]} {list(out[0][1])}"
        raise ValueError(msg)
    if "z" in names and (names.index("z") != 1 or out[1][1] != S[:3]):
        msg = f"layout: expected z [L, H, d_k] = {list(S[:3])} second, received {layout!r:.120}"
        raise ValueError(msg)
    for name, shape in out:
        if shape[0] != S[0]:
            msg = (
                f"layout: tensor {name!r} has {shape[0]} layers (its first dimension), S has {S[0]}"
            )
            raise ValueError(msg)
    total = sum(math.prod(shape) for _, shape in out)
    if total > MAX_ELEMENTS:
        msg = f"layout: {total} values in all, more than {MAX_ELEMENTS}"
        raise ValueError(msg)
    return tuple(out)


def _dim(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_DIM


def layout_to_json(layout: Layout) -> bytes:
    """The canonical JSON form: ``[["S", [L, H, K, V]], ["conv_q", [L, 3, 64]], ...]``."""
    return json.dumps([[n, list(s)] for n, s in layout], separators=(",", ":")).encode("ascii")


def layout_from_json(raw: bytes) -> Layout:
    """Parse and check a layout's JSON form (untrusted); ValueError saying what is wrong."""
    if len(raw) > _MAX_JSON:
        msg = f"layout: {len(raw)} bytes of JSON, more than {_MAX_JSON}"
        raise ValueError(msg)
    try:
        value = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as ex:
        msg = f"layout: not JSON ({ex})"
        raise ValueError(msg) from ex
    layout = check_layout(value)
    if layout_to_json(layout) != raw:
        msg = "layout: not in its canonical JSON form"
        raise ValueError(msg)
    return layout
