"""`linstream embed` on Flink: Beam's Flink job server (Flink 1.19, an embedded local cluster,
parallelism 2), LOOPBACK Python workers, run through deploy/flink/launch.sh as a user runs it."""

from __future__ import annotations

from helpers.engine_jobs import (
    assert_same_results,
    dead_letters,
    launch_cmd,
    launch_env,
    run,
    summary_line,
)


def test_embed_on_flink_equals_fn_api_runner(flink_job_server, case, tiny_model, tmp_path):
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    env = launch_env("flink", flink_job_server, tiny_model, case.input, out, ckpt)
    printed = run(launch_cmd("flink"), env)
    print(summary_line(printed))
    assert_same_results(case.reference, out, case.chunks)
    assert dead_letters(out) == dead_letters(case.reference)
    assert len(dead_letters(out)) == case.dead_letters
