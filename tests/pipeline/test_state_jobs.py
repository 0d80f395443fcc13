"""`linstream embed` jobs (FnApiRunner, separate processes) over states as data: a job keeps
commits every N tokens, one of them is exported, and a second job started from it with
`--initial-state SEQ=FILE` gives the first job's outputs for those chunks bit for bit; a fork
resumed by a third job equals one run over the fork's whole input.

The input is a chunk file (Parquet rows seq_id, chunk_index, final, tokens): the chunks are
given, so both jobs see exactly the same chunks after the cut.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.cli import linstream
from linstream.pipeline import Chunk
from linstream.pipeline.io import read_results, write_chunk_file

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # four whole jobs, each its own process

CHUNK = 8
RUNNER = "--runner=FnApiRunner"


def _chunks(seq_id, parts, first=0):
    return [Chunk(seq_id, first + i, p, final=i == len(parts) - 1) for i, p in enumerate(parts)]


def _embed(model, inp, out, *extra):
    proc = linstream(
        "embed", "--model", model, "--input", inp, "--output", out, "--emit", "tokens",
        "--progress-every", "0", *extra, RUNNER,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return read_results(str(out))


def test_export_import_and_fork_through_jobs(tmp_path, tiny_model_path):
    seed = 21
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 256, CHUNK).astype(np.int32) for _ in range(6)]
    new = [rng.integers(0, 256, CHUNK).astype(np.int32) for _ in range(2)]
    full = tmp_path / "full.parquet"
    write_chunk_file(str(full), _chunks("a", parts))
    ckpt = tmp_path / "ckpt"
    one = _embed(
        tiny_model_path, full, tmp_path / "o1", "--checkpoint-dir", ckpt,
        "--checkpoint-every", "1", "--keep-every-tokens", "16",
    )  # fmt: skip
    inspect = linstream("checkpoint", "inspect", ckpt, "--json")
    assert json.loads(inspect.stdout)["positions"] == [16, 32, 40, 48]

    state = tmp_path / "a16.safetensors"
    done = linstream("state", "export", ckpt, "--seq", "a", "--position", "16", "--out", state)
    assert done.returncode == 0, done.stderr
    cont = tmp_path / "cont.parquet"
    write_chunk_file(str(cont), _chunks("b", parts[2:]))
    two = _embed(tiny_model_path, cont, tmp_path / "o2", "--initial-state", f"b={state}")
    assert sorted(two) == [("b", i) for i in range(4)]
    for i in range(4):
        (start_b, out_b), (start_a, out_a) = two[("b", i)], one[("a", i + 2)]
        assert start_b == start_a == 16 + CHUNK * i
        assert out_b.tobytes() == out_a.tobytes()

    forked = linstream("checkpoint", "fork", ckpt, "--seq", "a", "--as", "f", "--position", "16")
    assert forked.returncode == 0, forked.stderr
    fork_input = tmp_path / "fork.parquet"
    write_chunk_file(str(fork_input), _chunks("f", parts[:2] + new))
    resumed = _embed(
        tiny_model_path, fork_input, tmp_path / "o3", "--checkpoint-dir", ckpt, "--resume"
    )
    whole = _embed(tiny_model_path, fork_input, tmp_path / "o4")
    assert sorted(resumed) == [("f", 2), ("f", 3)]  # chunks 0 and 1 are in f's commit
    for key, (start, out) in resumed.items():
        assert start == whole[key][0] and out.tobytes() == whole[key][1].tobytes()
