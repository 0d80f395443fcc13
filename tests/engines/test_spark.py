"""`linstream embed` on Spark: Beam's Spark job server with Spark 3.5 in `local[2]` (two task
threads), LOOPBACK Python workers, run through deploy/spark/launch.sh as a user runs it."""

from __future__ import annotations

import pytest
from helpers.engine_jobs import (
    assert_same_results,
    dead_letters,
    launch_cmd,
    launch_env,
    run,
    summary_line,
)
from helpers.engine_servers import need, start_job_server


@pytest.fixture(scope="module")
def spark_job_server(tmp_path_factory):
    need("spark")
    server = start_job_server(
        "spark", tmp_path_factory.mktemp("spark-job-server"), SPARK_MASTER_URL="local[2]"
    )
    try:
        yield server
    finally:
        server.stop()


def test_embed_on_spark_equals_fn_api_runner(spark_job_server, case, tiny_model, tmp_path):
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    env = launch_env("spark", spark_job_server, tiny_model, case.input, out, ckpt)
    printed = run(launch_cmd("spark"), env)
    print(summary_line(printed))
    assert_same_results(case.reference, out, case.chunks)
    assert dead_letters(out) == dead_letters(case.reference)
    assert len(dead_letters(out)) == case.dead_letters
