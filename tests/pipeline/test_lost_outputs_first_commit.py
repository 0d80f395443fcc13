"""Outputs lost when the store holds no commit before them: a sequence's only commit names its
rows from chunk 0, and that result file is deleted.  The next `--resume` computes the sequence
again from chunk 0 — from the job's `--initial-state` file, which names the sequence — says so in
one line, and its rows equal the uninterrupted run's bit for bit (same code, inputs and state).

A first job writes every chunk and one commit (`--checkpoint-every` beyond the chunk count: the
final chunk's commit alone), as in tests/pipeline/test_lost_outputs.py; the state file is a
commit of another store, so the sequence's positions go on from the file's."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from helpers.cli import linstream
from helpers.crash import embed_cmd
from linstream.pipeline import Chunk
from linstream.pipeline.app.embed_api import Resumable
from linstream.pipeline.io import read_results, write_chunk_file
from linstream.state import CheckpointStore
from linstream.state.exchange import write_state_file

pytestmark = pytest.mark.e2e  # two whole jobs, each its own process

CHUNK = 16
SEED = 31


def _state_file(tmp_path, model, rng) -> tuple[str, int]:
    """A state of the model after 40 tokens of another sequence, as a file."""
    ckpt = str(tmp_path / "ckpt-prefix")
    prefix = rng.integers(0, 256, 40).astype(np.int32)
    Resumable(ckpt, model, emit="mean", chunk_tokens=CHUNK, tokenizer="builtin:bytes").embed(
        {"p": prefix}
    )
    head = CheckpointStore(ckpt).head("p", fingerprint=None)
    assert head is not None and head.state.position == 40
    path = str(tmp_path / "p40.safetensors")
    write_state_file(path, head.state)
    return path, head.state.position


def test_lost_outputs_of_the_only_commit_restart_from_the_initial_state(tmp_path, tiny_model_path):
    print(f"seed {SEED}")
    rng = np.random.default_rng(SEED)
    state, at = _state_file(tmp_path, tiny_model_path, rng)
    parts = [rng.integers(0, 256, CHUNK).astype(np.int32) for _ in range(4)]
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, [Chunk("a", i, p, final=i == 3) for i, p in enumerate(parts)])
    ckpt, out1, out2 = (str(tmp_path / n) for n in ("ckpt", "out1", "out2"))
    extra = ("--emit", "tokens", "--checkpoint-every", "100", "--initial-state", f"a={state}")

    first = subprocess.run(
        embed_cmd(tiny_model_path, inp, out1, ckpt, *extra), capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr[-3000:]
    whole = read_results(out1)  # the uninterrupted run
    assert sorted(whole) == [("a", i) for i in range(4)]
    assert whole[("a", 0)][0] == at  # positions go on from the file's
    listed = linstream("checkpoint", "inspect", ckpt, "--json")
    (rec,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert rec["commits"] == 1, rec  # no commit before the lost outputs

    results = os.path.join(out1, "results")
    for name in os.listdir(results):
        if not name.startswith("."):
            os.remove(os.path.join(results, name))

    again = subprocess.run(
        embed_cmd(tiny_model_path, inp, out2, ckpt, "--resume", *extra),
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    said = [ln for ln in again.stderr.splitlines() if "the outputs of chunks 0..3 (commit 1," in ln]
    assert len(said) == 1 and "from chunk 0" in said[0], again.stderr[-3000:]
    got = read_results(out2)
    assert sorted(got) == sorted(whole)
    for key, (start, out) in whole.items():
        assert got[key][0] == start, key
        assert got[key][1].tobytes() == out.tobytes(), key
