"""Fuzz the two decoders of untrusted checkpoint bytes: the manifest parser and the state-file
decoder.  Real manifests and encoded states are bit-flipped, truncated, spliced and extended; the
only outcomes allowed are a `CheckpointError` or a value equal to what the bytes encode (a
mutated state file may decode only to the very state it held: padding bytes carry nothing)."""

from __future__ import annotations

import pytest
from helpers.store_faults import random_state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linstream.state import CheckpointError, CheckpointStore, decode_state, encode_state
from linstream.state.store.manifest import Manifest

_STATES = [
    random_state(0, (1, 2, 3, 4)),
    random_state(1, (2, 1, 2, 2), seq_id="β/seq", dtype="float32"),
]
_ENCODED = [encode_state(s) for s in _STATES]


def _manifests() -> list[bytes]:
    store = CheckpointStore("memory://linstream-fuzz-originals", background_prune=False)
    out = []
    for s in _STATES:
        store.commit(s)
        out.append(store.folders.fs.read(store.commits(s.seq_id)[0].manifest_path, 1 << 16))
    return out


_MANIFESTS = _manifests()


@st.composite
def mutated(draw: st.DrawFn, originals: list[bytes]) -> tuple[int, bytes]:
    which = draw(st.integers(0, len(originals) - 1))
    data = bytearray(originals[which])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "splice", "insert", "set"]))
        n = len(data)
        at = draw(st.integers(0, max(n - 1, 0)))
        if kind == "flip" and n:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice" and n:
            end = draw(st.integers(at, n))
            data[at:end] = draw(st.binary(max_size=64))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif kind == "set" and n:  # a plausible byte: digits, quotes, brackets, 0xff
            data[at] = draw(st.sampled_from(b'0123456789"[]{}-e.\xff\x00'))
    return which, bytes(data)


def _check_manifest(case: tuple[int, bytes]) -> None:
    _, raw = case
    try:
        m = Manifest.parse(raw, path="fuzz.manifest.json")
    except CheckpointError:
        return
    # Parsed: a well-formed manifest whose canonical form parses back to itself.
    assert Manifest.parse(m.to_bytes(), path="again") == m


def _check_state(case: tuple[int, bytes]) -> None:
    which, raw = case
    try:
        st_ = decode_state(raw)
    except CheckpointError:
        return
    assert st_ == _STATES[which], "a damaged state file decoded to another state"


_QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_LONG = settings(max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck))


@_QUICK
@given(mutated(_MANIFESTS))
def test_mutated_manifests_parse_or_raise_checkpoint_errors(case):
    _check_manifest(case)


@_QUICK
@given(mutated(_ENCODED))
def test_mutated_state_files_decode_to_themselves_or_raise_checkpoint_errors(case):
    _check_state(case)


@pytest.mark.slow
@_LONG
@given(mutated(_MANIFESTS))
def test_mutated_manifests_long(case):
    _check_manifest(case)


@pytest.mark.slow
@_LONG
@given(mutated(_ENCODED))
def test_mutated_state_files_long(case):
    _check_state(case)


def test_a_column_name_that_is_not_utf8_is_a_checkpoint_error():
    """Found by the long fuzz run: pyarrow raised UnicodeDecodeError from ``schema.names``."""
    raw = _ENCODED[0].replace(b"next_chunk", b"\xeeext_chunk")
    assert raw != _ENCODED[0]
    with pytest.raises(CheckpointError, match="does not decode"):
        decode_state(raw)


def test_the_originals_decode():
    for s, raw, m in zip(_STATES, _ENCODED, _MANIFESTS, strict=True):
        assert decode_state(raw) == s
        assert Manifest.parse(m, path="m").seq_id == s.seq_id
