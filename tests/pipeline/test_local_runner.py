"""The local run's state cache is sized by Beam's own `--max_cache_memory_usage_mb` (default 0,
no cache, as Beam's SDK harness on every other runner), not by FnApiRunner's fixed 100 MB; the
outputs do not depend on it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from helpers.cli import linstream
from linstream.pipeline.app.job import run_embed
from linstream.pipeline.app.local_runner import state_cache_for
from linstream.pipeline.app.options import EmbedConfig
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import read_results, write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _runner_mb():
    """The size FnApiRunner gives the next in-process worker's state cache (MB)."""
    return worker_handlers.STATE_CACHE_SIZE_MB


def _embed_args(tmp_path, tiny_model_path, name):
    return EmbedConfig(
        input=str(tmp_path / "in.parquet"),
        model=tiny_model_path,
        emit="mean",
        backend="numpy",
        checkpoint_every=2,
        progress_every=0,
        output=str(tmp_path / f"out-{name}"),
        checkpoint_dir=str(tmp_path / f"ckpt-{name}"),
    )


@pytest.mark.parametrize(("flag", "expected_mb"), [(None, 0), ("7", 7)])
def test_the_in_process_worker_builds_its_cache_from_the_option(
    tmp_path, tiny_model_path, monkeypatch, flag, expected_mb
):
    built = []

    class Recording(worker_handlers.StateCache):  # the runner's own cache, its size recorded
        def __init__(self, max_weight):
            built.append(max_weight)
            super().__init__(max_weight)

    monkeypatch.setattr(worker_handlers, "StateCache", Recording)
    write_chunk_file(
        str(tmp_path / "in.parquet"), sample_chunks(3, 40, 8, seed=1, shuffle=True, vocab_size=256)
    )
    before = _runner_mb()
    beam_args = [] if flag is None else [f"--max_cache_memory_usage_mb={flag}"]
    run = run_embed(_embed_args(tmp_path, tiny_model_path, "x"), beam_args)
    assert run.tokens == 3 * 40
    assert built and set(built) == {expected_mb << 20}
    assert _runner_mb() == before  # FnApiRunner's own, once the run ends


def test_overlapping_runs_share_the_setting_and_the_last_out_restores():
    before = _runner_mb()
    a_in, b_out = threading.Event(), threading.Event()
    seen = {}

    def first():
        with state_cache_for(PipelineOptions(["--max_cache_memory_usage_mb=3"])):
            a_in.set()
            b_out.wait(10)
            seen["a after b left"] = _runner_mb()

    t = threading.Thread(target=first)
    t.start()
    assert a_in.wait(10)
    with state_cache_for(PipelineOptions([])) as mb:
        assert mb == 0 and _runner_mb() == 0
    b_out.set()
    t.join(10)
    assert seen["a after b left"] == 0  # still inside a run: not restored yet
    assert _runner_mb() == before
    with pytest.raises(RuntimeError), state_cache_for(PipelineOptions([])):
        raise RuntimeError("a failed run")
    assert _runner_mb() == before


def test_the_written_outputs_are_the_same_with_and_without_a_cache(tmp_path, tiny_model_path):
    seed = 20261201
    print(f"seed {seed}")
    write_chunk_file(
        str(tmp_path / "in.parquet"),
        sample_chunks(5, 200, 16, seed=seed, shuffle=True, duplicates=3, vocab_size=256),
    )
    common = ["--input", "in.parquet", "--model", tiny_model_path, "--backend", "numpy"]
    common += ["--checkpoint-every", "3"]
    got = {}
    for name, extra in {"none": [], "cached": ["--max_cache_memory_usage_mb=100"]}.items():
        proc = linstream(
            "embed", *common, "--output", f"out-{name}", "--checkpoint-dir", f"ck-{name}",
            *extra, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        got[name] = read_results(str(tmp_path / f"out-{name}"))
    assert len(got["none"]) == 5 * (200 // 16 + 1)
    assert got["none"].keys() == got["cached"].keys()
    for key, (start, emb) in got["none"].items():
        assert got["cached"][key][0] == start
        np.testing.assert_array_equal(got["cached"][key][1], emb)  # same kernels, same bits
