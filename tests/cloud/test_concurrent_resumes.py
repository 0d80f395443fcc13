"""Two `linstream embed --resume` jobs at once on one checkpoint store on S3 (a local moto
server): as on local disk, the store fences the slower one cleanly (its chunks of a sequence the
other advanced are dead letters `fenced`, it exits 0), nothing is left behind, and one more
`--resume` completes the union of the results.  (Before: the slower one exited 1, "manifest
disappeared", and left an orphan data file.)  `make slow` runs it on GCS too; the fault matrix
runs the same case smaller on GCS in `make test`."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from helpers.models import write_tiny_model
from helpers.outputs import judge
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import write_chunk_file

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.app.cli"]


def embed(model: str, inp: str, out: str, ckpt: str, *extra: str) -> list[str]:
    return [
        *LINSTREAM,
        "embed",
        "--model",
        model,
        "--backend",
        "numpy",
        "--input",
        inp,
        "--output",
        out,
        "--checkpoint-dir",
        ckpt,
        "--progress-every",
        "0",
        "--runner=FnApiRunner",
        *extra,
    ]


@pytest.mark.parametrize("kind", ["s3", pytest.param("gs", marks=pytest.mark.slow)])
def test_two_concurrent_resumes_are_fenced_cleanly(kind, request, tmp_path):
    store = request.getfixturevalue("s3_store" if kind == "s3" else "gcs_store")
    model = write_tiny_model(str(tmp_path / "tiny.safetensors"), seed=3)
    chunks = sample_chunks(4, 24 * 16, 16, seed=23, shuffle=True, vocab_size=256)
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, chunks)
    every = ("--checkpoint-every", "2")
    ref = str(tmp_path / "reference")
    subprocess.run(embed(model, inp, ref, str(tmp_path / "ckpt-ref"), *every), check=True)

    run = store.url(f"twins-{uuid.uuid4().hex[:8]}")
    ckpt = f"{run}/ckpt"
    outs = [f"{run}/out-{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            embed(model, inp, out, ckpt, "--resume", *every, *store.beam_args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ.copy(),
        )
        for out in outs
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0 and "Traceback" not in log, log[-3000:]
        assert "disappeared" not in log, log[-3000:]
    final = f"{run}/out-final"
    done = subprocess.run(
        embed(model, inp, final, ckpt, "--resume", *every, *store.beam_args),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = judge(ref, [*outs, final])
    assert verdict.ok, f"{verdict}\n{logs[0][-1500:]}\n{logs[1][-1500:]}"
    verify = subprocess.run(
        [*LINSTREAM, "checkpoint", "verify", ckpt], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "orphan" not in verify.stdout, verify.stdout
