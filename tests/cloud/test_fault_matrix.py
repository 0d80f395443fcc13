"""The fault matrix (tests/helpers/fault_matrix.py): {local disk, S3, GCS} x {plain stop, twin
job, frozen writer, skewed clock, crafted manifest, damaged file}, each judged on the union of
the written results (every chunk once, bit-identical to an uninterrupted run) and by
`linstream checkpoint verify`.

`make test` runs every fault on local disk and each fault once on an object store (S3 or GCS in
turn); `make slow` runs the whole matrix with three seeds per cell on a larger input.  Each
fault's own reproduction (that failed before its fix) is a test of its own: tests/pipeline/
test_crafted_manifest.py, test_frozen_writer.py, test_lost_outputs.py, and
tests/cloud/test_concurrent_resumes.py."""

from __future__ import annotations

import uuid

import pytest
from helpers.fault_matrix import FAULTS, Cell, make_inputs, run_cell

KINDS = ("local", "s3", "gs")
#: The short run: every fault on local disk, and each on one object store (two concurrent
#: resumes on S3, at a larger scale, are test_concurrent_resumes.py).
SHORT = [("local", f) for f in FAULTS] + [
    ("s3", "frozen-writer"),
    ("s3", "damaged-file"),
    ("s3", "crafted-manifest"),
    ("gs", "plain-stop"),
    ("gs", "skewed-clock"),
    ("gs", "twin-job"),
]


@pytest.fixture(scope="module")
def small_inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("matrix-small"), sequences=2, chunks=12, seed=31)


@pytest.fixture(scope="module")
def large_inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("matrix-large"), sequences=4, chunks=24, seed=37)


def _cell(kind, request, inputs, tmp_path, seed):
    if kind == "local":
        base, args = str(tmp_path / "area"), []
    else:
        store = request.getfixturevalue("s3_store" if kind == "s3" else "gcs_store")
        base, args = store.url(f"matrix-{uuid.uuid4().hex[:8]}"), store.beam_args
    work = tmp_path / "work"
    work.mkdir()
    return Cell(inputs, base, args, work, seed)


@pytest.mark.parametrize(("kind", "fault"), SHORT)
def test_fault_matrix(kind, fault, request, small_inputs, tmp_path):
    seed = 4100 + 10 * KINDS.index(kind) + FAULTS.index(fault)
    print(f"fault matrix {kind} x {fault}: seed {seed}")
    cell = _cell(kind, request, small_inputs, tmp_path, seed)
    problems = run_cell(cell, fault)
    assert not problems, "\n".join(problems) + f"\n(jobs' output in {cell.log})"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", KINDS)
def test_fault_matrix_long(kind, fault, seed, request, large_inputs, tmp_path):
    seed = 5000 + 100 * KINDS.index(kind) + 10 * FAULTS.index(fault) + seed
    print(f"fault matrix (long) {kind} x {fault}: seed {seed}")
    cell = _cell(kind, request, large_inputs, tmp_path, seed)
    problems = run_cell(cell, fault)
    assert not problems, "\n".join(problems) + f"\n(jobs' output in {cell.log})"
