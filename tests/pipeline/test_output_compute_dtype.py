"""An output folder's record holds the compute dtype its rows were computed in, as a user meets
it: a second `linstream embed` process appending rows in the other mode to a float32 job's
output is refused in one line naming both modes (nothing written), one in the same mode adds
its rows; a job resuming its checkpoints in the other mode continues (the checkpoints' promise)
and the record then lists both modes, so a later append in either is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line
from helpers.fla_folders import TINY_CONFIGS, write_folder
from linstream.pipeline.io.output_record import output_contents, read_record

pytestmark = pytest.mark.e2e  # whole jobs in subprocesses: `make check` leaves it out

SEED = 20261206


def _input(path, ids):
    with open(path, "w") as f:
        for i, seq in enumerate(ids):
            f.write(json.dumps({"id": f"s{i}", "tokens": seq.tolist()}) + "\n")
    return str(path)


def _job(folder, inp, out, mode, *extra):
    return linstream(
        "embed", "--model", folder, "--input", inp, "--input-format", "tokens-jsonl",
        "--chunk-tokens", "8", "--output", out, "--compute-dtype", mode,
        "--progress-every", "0", *extra,
    )  # fmt: skip


def _record(out):
    return json.loads((out / "_linstream_output.json").read_text())["compute_dtypes"]


def test_appending_in_the_other_mode_is_refused_naming_both(tmp_path):
    print(f"seed {SEED}")
    folder = str(write_folder(tmp_path / "gla", TINY_CONFIGS["gla"], dtype="BF16", seed=2))
    ids = np.random.default_rng(SEED).integers(0, 50, (2, 24))
    inp = _input(tmp_path / "in.jsonl", ids)
    out = tmp_path / "out"
    done = _job(folder, inp, out, "float32")
    assert done.returncode == 0, done.stderr
    assert _record(out) == ["float32"]
    files = output_contents(str(out)).result_files

    refused = _job(folder, inp, out, "bfloat16", "--output-mode", "append")
    line = one_error_line(refused)
    print(line)
    assert refused.returncode == 2
    assert "holds embeddings computed in float32" in line
    assert "this job computes in bfloat16" in line
    assert output_contents(str(out)).result_files == files  # nothing written
    assert _record(out) == ["float32"]

    same = _job(folder, inp, out, "float32", "--output-mode", "append")
    assert same.returncode == 0, same.stderr
    assert len(output_contents(str(out)).result_files) > len(files)
    assert read_record(str(out)).compute_dtypes == ("float32",)


def test_a_resume_in_the_other_mode_continues_and_the_record_lists_both(tmp_path):
    print(f"seed {SEED}")
    folder = str(write_folder(tmp_path / "gla", TINY_CONFIGS["gla"], dtype="BF16", seed=2))
    ids = np.random.default_rng(SEED).integers(0, 50, (2, 24))
    part = _input(tmp_path / "part.jsonl", ids[:, :16])
    full = _input(tmp_path / "full.jsonl", ids)
    out, ckpt = tmp_path / "out", str(tmp_path / "ckpt")
    first = _job(folder, part, out, "bfloat16", "--checkpoint-dir", ckpt)
    assert first.returncode == 0, first.stderr
    assert _record(out) == ["bfloat16"]
    resumed = _job(folder, full, out, "float32", "--checkpoint-dir", ckpt, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _record(out) == ["bfloat16", "float32"]
    refused = _job(folder, full, out, "float32", "--output-mode", "append")
    line = one_error_line(refused)
    print(line)
    assert refused.returncode == 2
    assert "holds embeddings computed in bfloat16 and float32" in line
