"""The remote-worker path: `linstream embed` through Beam's PortableRunner to a job server (Beam's
Python local job service, in this process) whose SDK workers come from an external worker pool
(`python -m apache_beam.runners.worker.worker_pool_main`, the sidecar of the Flink manifest);
outputs equal the FnApiRunner's."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import read_dead_letters, read_results, write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

LINSTREAM = [sys.executable, "-m", "linstream.pipeline.app.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"worker pool exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"worker pool not listening on 127.0.0.1:{port} after {timeout} s")


WORKERS = 2


@pytest.fixture(scope="module")
def job_server():
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    class Runner(fn_runner.FnApiRunner):
        """The job service's runner with WORKERS SDK workers per environment: the service has
        no option for it (it ignores --direct_num_workers), as a Flink cluster has its
        parallelism."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._num_workers = WORKERS

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_job_service.fn_runner, "FnApiRunner", Runner)
        servicer = local_job_service.LocalJobServicer()
        port = servicer.start_grpc_server(0)
        yield f"localhost:{port}"
        servicer.stop()


@pytest.fixture(scope="module")
def worker_pool(tmp_path_factory):
    port = _free_port()
    env = os.environ.copy()
    # The pool starts each SDK worker with the `python` on PATH: this interpreter's.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    log_path = tmp_path_factory.mktemp("pool") / "worker_pool.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apache_beam.runners.worker.worker_pool_main",
                f"--service_port={port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            _wait_for_port(port, proc)
            yield f"localhost:{port}", log_path
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _embed(inp: str, out: str, model: str, *beam_args: str) -> None:
    cmd = [
        *LINSTREAM,
        "embed",
        "--input",
        inp,
        "--output",
        out,
        "--model",
        model,
        "--backend",
        "numpy",
        "--progress-every",
        "0",
        *beam_args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr[-4000:]}"


def test_portable_runner_with_external_worker_pool_equals_fn_api_runner(
    tmp_path, tiny_model_path, job_server, worker_pool
):
    pool, pool_log = worker_pool
    chunks = sample_chunks(4, 5 * 16, 16, seed=13, shuffle=True, vocab_size=256)
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, chunks)
    local, remote = str(tmp_path / "local"), str(tmp_path / "remote")
    _embed(inp, local, tiny_model_path, "--runner=FnApiRunner")
    _embed(
        inp,
        remote,
        tiny_model_path,
        "--runner=PortableRunner",
        f"--job_endpoint={job_server}",
        "--environment_type=EXTERNAL",
        f"--environment_config={pool}",
    )
    want, got = read_results(local), read_results(remote)
    assert len(want) == len(chunks)
    assert set(got) == set(want)
    for key, (start, out) in want.items():
        assert got[key][0] == start, key
        np.testing.assert_array_equal(got[key][1], out, err_msg=str(key))
    assert read_dead_letters(remote) == []
    # The work ran in the SDK workers the pool started (two), not in the job server's process.
    log = pool_log.read_text()
    ids = set(re.findall(r'worker_id="([^"]+)"', log))
    assert len(ids) >= WORKERS, log[-3000:]
