"""`linstream embed` with input, output, model and checkpoints all on s3:// and on gs://
(local moto and fake-gcs-server), then a `--resume` job; compared with one local run."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
from helpers.models import write_tiny_model
from linstream.pipeline.app.job import run_embed
from linstream.pipeline.app.options import EmbedConfig
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import read_dead_letters, read_results, write_chunk_file
from linstream.state import CheckpointStore

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.app.cli"]
SEQUENCES, CHUNKS, SIZE = 3, 6, 16


@pytest.fixture(scope="module")
def job_inputs(tmp_path_factory):
    """Local files: the model, all chunks, part 1 (each sequence's first chunks) and part 2,
    and the results of one uninterrupted local job."""
    d = tmp_path_factory.mktemp("cloud-inputs")
    model = write_tiny_model(str(d / "tiny.safetensors"), seed=3)
    chunks = sample_chunks(SEQUENCES, CHUNKS * SIZE, SIZE, seed=7, shuffle=True, vocab_size=256)
    stop = {f"seq-{s:04d}": 2 + s for s in range(SEQUENCES)}  # 2, 3, 4 chunks in part 1
    files = {
        "all": [c for c in chunks],
        "part1": [c for c in chunks if c.index < stop[c.seq_id]],
        "part2": [c for c in chunks if c.index >= stop[c.seq_id]],
    }
    for name, cs in files.items():
        write_chunk_file(str(d / f"{name}.parquet"), cs)
    out = str(d / "local-out")
    run_embed(
        EmbedConfig(
            input=str(d / "all.parquet"), output=out, model=model, backend="numpy", progress_every=0
        ),
        ["--runner=FnApiRunner"],
    )
    reference = read_results(out)
    assert len(reference) == SEQUENCES * CHUNKS
    return d, model, stop, reference


def _embed(store, inp, out, model, ckpt, *extra):
    cmd = [
        *LINSTREAM,
        "embed",
        "--input",
        inp,
        "--output",
        out,
        "--model",
        model,
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        "2",
        "--backend",
        "numpy",
        "--progress-every",
        "0",
        "--runner=FnApiRunner",
        *store.beam_args,
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


def test_embed_and_resume_with_everything_on_the_object_store(object_store, job_inputs):
    local, model, stop, reference = job_inputs
    fs = object_store.fs()
    run = object_store.url(f"job-{uuid.uuid4().hex[:8]}")
    for name in ("part1", "part2"):
        fs.put_file(str(local / f"{name}.parquet"), f"{run}/in/{name}/chunks.parquet")
    fs.put_file(model, f"{run}/model/tiny.safetensors")
    remote_model = f"{run}/model/tiny.safetensors"
    ckpt = f"{run}/checkpoints"

    _embed(object_store, f"{run}/in/part1/*.parquet", f"{run}/out1", remote_model, ckpt)
    first = read_results(f"{run}/out1")
    assert set(first) == {(s, i) for s, n in stop.items() for i in range(n)}

    # Every sequence committed its last applied chunk in the store on the object store.
    store = CheckpointStore(ckpt)
    assert store.sequences() == sorted(stop)
    assert store.verify() == []

    _embed(object_store, f"{run}/in/part2/*.parquet", f"{run}/out2", remote_model, ckpt, "--resume")
    second = read_results(f"{run}/out2")
    assert set(second) == {(s, i) for s, n in stop.items() for i in range(n, CHUNKS)}
    assert read_dead_letters(f"{run}/out1") == [] and read_dead_letters(f"{run}/out2") == []

    union = {**first, **second}
    assert set(union) == set(reference)
    for key, (start, out) in reference.items():
        assert union[key][0] == start, key
        # Same model, backend and float64 state on both sides: bit-identical outputs.
        np.testing.assert_array_equal(union[key][1], out, err_msg=str(key))
    # Nothing but Parquet files under <output>/results: one read of the folder finds them all.
    import fsspec
    import pyarrow.dataset as ds

    results_fs, results_path = fsspec.core.url_to_fs(f"{run}/out2/results")
    table = ds.dataset(results_path, filesystem=results_fs, format="parquet").to_table()
    assert table.num_rows == len(second)
