"""Compressed text files as `linstream embed` reads them: decompressed, each one the sequence of
its path without the compression suffix, and counted by its text (the progress line's total is
what the job embeds, not the compressed bytes)."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line, write_texts
from linstream.pipeline.io import read_results

pytestmark = pytest.mark.e2e  # whole jobs in subprocesses: `make check` leaves it out


def _embed(tmp_path, inp: str, out: str, model: str, *extra: str):
    return linstream(
        "embed", "--input", inp, "--output", out, "--model", model, "--backend", "numpy",
        "--chunk-tokens", "64", *extra, cwd=tmp_path,
    )  # fmt: skip


def test_a_gzipped_file_is_its_text_named_without_gz_and_counted_as_text(tmp_path, tiny_model_path):
    seed = 11
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    texts = {
        "a.txt": "".join(rng.choice(list("abcdefgh \n"), size=500)),
        "notes/b.txt": "".join(rng.choice(list("ijklmnop \n"), size=700)),
    }
    write_texts(tmp_path / "plain", texts)
    (tmp_path / "packed" / "notes").mkdir(parents=True)
    (tmp_path / "packed" / "a.txt").write_text(texts["a.txt"])
    (tmp_path / "packed" / "notes" / "b.txt.gz").write_bytes(
        gzip.compress(texts["notes/b.txt"].encode())  # compresses well: fewer bytes than text
    )
    plain = _embed(tmp_path, "plain", "out-plain", tiny_model_path)
    assert plain.returncode == 0, plain.stderr
    packed = _embed(tmp_path, "packed", "out-packed", tiny_model_path, "-v")
    assert packed.returncode == 0, packed.stderr
    # The same sequences, the same numbers: the gzipped file is its text, named without .gz.
    got, want = (
        read_results(str(tmp_path / "out-packed")),
        read_results(str(tmp_path / "out-plain")),
    )
    assert sorted(got) == sorted(want)
    assert {s for s, _ in got} == {"a.txt", "notes/b.txt"}
    for key, (start, emb) in want.items():
        assert got[key][0] == start
        np.testing.assert_array_equal(got[key][1], emb)
    # The progress line's total is the text's bytes (1,200 tokens with builtin:bytes), so the
    # job ends at 100% of what it embedded.
    total = sum(len(t.encode()) for t in texts.values())
    staged = [ln for ln in packed.stderr.splitlines() if " / " in ln and " tokens (" in ln]
    assert staged, packed.stderr
    done, of = re.search(r"([\d,]+) / ([\d,]+) tokens", staged[-1]).groups()  # type: ignore[union-attr]
    assert int(of.replace(",", "")) == total == int(done.replace(",", "")), staged[-1]


def test_a_file_and_its_gzipped_twin_would_be_one_sequence_and_are_refused(
    tmp_path, tiny_model_path
):
    write_texts(tmp_path / "in", {"a.txt": "text"})
    (tmp_path / "in" / "a.txt.gz").write_bytes(gzip.compress(b"other text"))
    proc = _embed(tmp_path, "in", "out", tiny_model_path)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "would both be sequence 'a.txt'" in line, line
    assert not (tmp_path / "out").exists()
