"""State files (safetensors): what is written comes back exactly; what is bad or foreign is refused
with one line that names the file and what was expected."""

from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np
import pytest
from linstream.state import SequenceState
from linstream.state.exchange import (
    MAX_HEADER_BYTES,
    StateFileError,
    StateSpec,
    read_state_file,
    state_file_bytes,
    write_state_file,
)
from linstream.state.layout import layout_to_json
from safetensors.numpy import load, save

FP = "ab" * 32
OTHER_FP = "cd" * 32


def _state(dtype=np.float64, seed=0, named=False) -> SequenceState:
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((2, 2, 3, 4)).astype(dtype)
    if named:  # an fla model's state: S, no z, a convolution tail
        conv = rng.standard_normal((2, 3, 8)).astype(dtype)
        return SequenceState("src", 40, 5, S, None, FP, {"conv_q": conv})
    z = rng.standard_normal((2, 2, 3)).astype(dtype)
    return SequenceState("src", 40, 5, S, z, FP)


@pytest.mark.parametrize(("dtype", "named"), [(np.float64, False), (np.float32, True)])
def test_written_state_reads_back_bit_for_bit_with_its_metadata(tmp_path, dtype, named):
    st = _state(dtype, named=named)
    path = str(tmp_path / "s.safetensors")
    size = write_state_file(path, st)
    assert size == (tmp_path / "s.safetensors").stat().st_size
    back = read_state_file(path, StateSpec.of(st))
    assert back == st  # tensors bit for bit, position, next chunk, fingerprint, dtype
    assert back.dtype == np.dtype(dtype)
    # An ordinary safetensors reader sees the named tensors and the metadata.
    tensors = load((tmp_path / "s.safetensors").read_bytes())
    assert sorted(tensors) == sorted(st.tensors)
    header_len = struct.unpack("<Q", (tmp_path / "s.safetensors").read_bytes()[:8])[0]
    meta = json.loads((tmp_path / "s.safetensors").read_bytes()[8 : 8 + header_len])
    meta = meta["__metadata__"]
    assert meta["format"] == "linstream.state" and meta["format_version"] == "1"
    assert (meta["position"], meta["next_chunk"], meta["seq_id"]) == ("40", "5", "src")
    assert meta["fingerprint"] == FP and meta["dtype"] == np.dtype(dtype).name


def _crafted(tensors, **meta_changes):
    st = _state()
    meta = {
        "format": "linstream.state",
        "format_version": "1",
        "fingerprint": FP,
        "seq_id": "src",
        "position": "40",
        "next_chunk": "5",
        "dtype": "float64",
        "layout": layout_to_json(st.layout).decode("ascii"),
    }
    meta.update(meta_changes)
    return save(tensors, metadata=meta)


def _bad_files():
    st = _state()
    good = state_file_bytes(st)
    S, z = st.S, st.z
    nan_S = S.copy()
    nan_S[0, 0, 0, 0] = np.nan
    return {
        "truncated": (good[: len(good) - 40], "truncated or damaged"),
        "header cut": (good[:20], "truncated, or not safetensors"),
        "not safetensors": (b"this is a text file, not a state\n" * 4, "expected a safetensors"),
        "huge header": (struct.pack("<Q", 1 << 40) + b"{}", f"at most {MAX_HEADER_BYTES:,}"),
        "plain safetensors": (save({"S": S, "z": z}), "expected linstream state metadata"),
        "missing tensor": (_crafted({"S": S}), "expected tensors S, z, found S (missing z)"),
        "extra tensor": (_crafted({"S": S, "z": z, "w": z}), "(extra w)"),
        "mis-shaped": (_crafted({"S": S[:, :1], "z": z}), "tensor S: expected F64 [2, 2, 3, 4]"),
        "NaN": (_crafted({"S": nan_S, "z": z}), "tensor S: expected finite values, found 1 NaN"),
        "another model": (_crafted({"S": S, "z": z}, fingerprint=OTHER_FP), "another model"),
        "another dtype": (
            _crafted({"S": S.astype(np.float32), "z": z.astype(np.float32)}, dtype="float32"),
            "expected a float64 state",
        ),
        "newer format": (_crafted({"S": S, "z": z}, format_version="9"), "format_version 1"),
    }


@pytest.mark.parametrize("case", sorted(_bad_files()))
def test_bad_or_foreign_state_file_is_one_line_naming_file_and_expectation(tmp_path, case):
    data, words = _bad_files()[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(StateFileError) as info:
        read_state_file(str(path), StateSpec.of(_state()))
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"state file {path}: ")
    assert "expected" in text
    assert words in text, text


def test_foreign_state_names_both_fingerprints(tmp_path):
    path = tmp_path / "other.safetensors"
    write_state_file(str(path), dataclasses.replace(_state(), fingerprint=OTHER_FP))
    with pytest.raises(StateFileError) as info:
        read_state_file(str(path), StateSpec.of(_state()))
    assert FP[:16] in str(info.value) and OTHER_FP[:16] in str(info.value)


def test_a_file_larger_than_the_state_it_must_hold_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.safetensors"
    spec = StateSpec.of(_state())
    with open(path, "wb") as f:  # sparse: its size alone must refuse it
        f.truncate(spec.nbytes + MAX_HEADER_BYTES + 9)
    with pytest.raises(StateFileError, match="expected at most"):
        read_state_file(str(path), spec)


def test_missing_file_and_folder_are_one_line(tmp_path):
    with pytest.raises(StateFileError, match="no such file"):
        read_state_file(str(tmp_path / "none.safetensors"))
    with pytest.raises(StateFileError, match="found a folder"):
        read_state_file(str(tmp_path))
