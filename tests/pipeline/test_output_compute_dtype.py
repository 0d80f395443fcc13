"""An output folder's record holds the compute dtype its rows were computed in, as a user meets
it: a second `linstream embed` process appending rows in the other mode to a bfloat16 job's
output is refused in one line naming both modes (nothing written); a job resuming its
checkpoints in the other mode continues (the checkpoints' promise, tests/pipeline/
test_fla_bf16_cli.py) and the record then lists both modes.  Each result file carries the mode
of its rows in its Parquet schema metadata (`linstream.pipeline.result_metadata`), whichever
writer wrote it (the committed spans; Beam's file sink, in a job without --checkpoint-dir).
The Python API's `embed()` Tables carry the mode in their schema metadata.  (Appending in the
same mode: tests/pipeline/test_second_run.py, whose jobs now record their mode too.)"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers.cli import linstream, one_error_line
from helpers.fla_folders import TINY_CONFIGS, write_folder
from linstream.pipeline import Chunk
from linstream.pipeline.io import write_chunk_file
from linstream.pipeline.io.output_record import output_contents, read_record
from linstream.pipeline.result_metadata import compute_dtype_of

pytestmark = pytest.mark.e2e  # whole jobs in subprocesses: `make check` leaves it out

SEED = 20261206
CHUNKS = 3


def _chunks(path, ids, upto):
    """Chunks 0..upto-1 of 8 tokens of each sequence; the last of all CHUNKS marked final."""
    chunks = [
        Chunk(f"s{s}", i, ids[s, 8 * i : 8 * (i + 1)].astype(np.int32), final=i == CHUNKS - 1)
        for s in range(len(ids))
        for i in range(upto)
    ]
    write_chunk_file(str(path), chunks)
    return str(path)


def _job(folder, inp, out, mode, *extra):
    return linstream(
        "embed", "--model", folder, "--input", inp, "--output", out, "--compute-dtype", mode,
        "--progress-every", "0", *extra,
    )  # fmt: skip


def _record(out):
    return json.loads((out / "_linstream_output.json").read_text())["compute_dtypes"]


def _file_modes(files):
    """Each result file's compute dtype, read from the written Parquet file's schema."""
    return {f: compute_dtype_of(pq.read_schema(f)) for f in files}


def test_another_mode_is_refused_naming_both_unless_it_resumes(tmp_path):
    print(f"seed {SEED}")
    folder = str(write_folder(tmp_path / "gla", TINY_CONFIGS["gla"], dtype="BF16", seed=2))
    ids = np.random.default_rng(SEED).integers(0, 50, (2, 8 * CHUNKS))
    part = _chunks(tmp_path / "part.parquet", ids, 2)
    full = _chunks(tmp_path / "full.parquet", ids, CHUNKS)
    out, ckpt = tmp_path / "out", str(tmp_path / "ckpt")
    first = _job(folder, part, out, "bfloat16", "--checkpoint-dir", ckpt)
    assert first.returncode == 0, first.stderr
    assert _record(out) == ["bfloat16"]
    files = output_contents(str(out)).result_files
    assert files and set(_file_modes(files).values()) == {"bfloat16"}  # the committed spans'

    # a second process appending float32 rows to the bfloat16 rows: one line, both modes
    refused = _job(folder, full, out, "float32", "--output-mode", "append")
    line = one_error_line(refused)
    print(line)
    assert refused.returncode == 2
    assert "holds embeddings computed in bfloat16" in line
    assert "this job computes in float32" in line
    assert output_contents(str(out)).result_files == files  # nothing written
    assert _record(out) == ["bfloat16"]

    # resuming the checkpoints in the other mode continues them; the record lists both modes
    resumed = _job(folder, full, out, "float32", "--checkpoint-dir", ckpt, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    after = output_contents(str(out))
    assert len(after.result_files) > len(files) and not after.dead_letter_files
    modes = _file_modes(after.result_files)
    assert {modes[f] for f in files} == {"bfloat16"}  # the first job's files, as they were
    assert {modes[f] for f in set(after.result_files) - set(files)} == {"float32"}
    assert read_record(str(out)).compute_dtypes == ("bfloat16", "float32")


def test_embed_tables_carry_their_compute_dtype(tmp_path):
    from linstream.pipeline import embed

    folder = write_folder(tmp_path / "gla", {**TINY_CONFIGS["gla"], "vocab_size": 256}, seed=3)
    ids = np.arange(1, 20, dtype=np.int32)
    for mode in ("float32", "bfloat16"):
        table = embed(ids, str(folder), emit="mean", compute_dtype=mode, tokenizer="builtin:bytes")
        assert table.schema.metadata[b"linstream.compute_dtype"] == mode.encode(), mode


def test_files_of_a_job_without_checkpoints_carry_their_compute_dtype(tmp_path):
    """Beam's file sink (no --checkpoint-dir) writes the mode into each file too."""
    print(f"seed {SEED}")
    folder = str(write_folder(tmp_path / "gla", TINY_CONFIGS["gla"], dtype="BF16", seed=2))
    ids = np.random.default_rng(SEED).integers(0, 50, (2, 8 * CHUNKS))
    inp = _chunks(tmp_path / "in.parquet", ids, CHUNKS)
    out = tmp_path / "out"
    done = _job(folder, inp, out, "bfloat16", "--runner=FnApiRunner")
    assert done.returncode == 0, done.stderr
    files = output_contents(str(out)).result_files
    assert files and set(_file_modes(files).values()) == {"bfloat16"}
