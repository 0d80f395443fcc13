"""Crash and resume on Flink: the job server (with its embedded Flink cluster) and the job's
Python workers (LOOPBACK: in the `linstream embed` process) are SIGKILLed at random moments
(seeds printed), the job is resumed with --resume on a new Flink job server, and the union of the
results holds every chunk exactly once, bit-identical to an uninterrupted run; two concurrent
--resume jobs on one checkpoint folder never both write a chunk (the later one's are fenced)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter

import numpy as np
import pytest
from helpers.crash import _left, commits_made, judge
from helpers.engine_jobs import JOB_TIMEOUT_S, dead_letters, launch_cmd, launch_env, run
from helpers.engine_servers import Server, need, start_job_server

KILLS = 2


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _stop_at_random(
    rng: np.random.Generator,
    server: Server,
    proc: subprocess.Popen,
    ckpt: str,
    left_commits: int,
    before: int,
) -> tuple[str, int]:
    """Once the job has made a random number of commits in ``ckpt`` (it is in the middle of
    them; ``before``: the commits made before it started), wait a random moment and SIGKILL the
    job server, the workers, or both, in a random order and gap; returns (what was killed, the
    command's exit status)."""
    after_files = int(rng.integers(1, max(left_commits, 1) + 1))
    after_s, gap_s = (float(x) for x in rng.uniform(0.0, 1.0, size=2))
    victims = str(rng.choice(["server", "workers", "both"]))
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (
        time.monotonic() < deadline
        and proc.poll() is None
        and commits_made(ckpt) - before < after_files
    ):
        time.sleep(0.02)
    time.sleep(after_s)
    landed = proc.poll() is None
    if victims == "both":
        server.kill()
        _kill_group(proc)
    elif victims == "server":
        server.kill()
        time.sleep(gap_s)
        try:  # the command sees its job server gone and exits by itself
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
    else:
        _kill_group(proc)
        time.sleep(gap_s)
        server.kill()  # a job whose workers died would be restarted on Flink forever
    server.stop()
    rc = proc.wait(timeout=60)
    what = f"{victims} after {after_files} commit(s) + {after_s:.2f} s"
    return (what if landed else f"{what} (the job had ended)"), rc


@pytest.mark.parametrize("seed", [31])
def test_flink_killed_at_random_moments_then_resumed(seed, clean_case, tiny_model, tmp_path):
    need("flink")
    print(f"flink crash seed {seed}")
    rng = np.random.default_rng(seed)
    ckpt = str(tmp_path / "ckpt")
    files = commits_made(os.path.join(os.path.dirname(clean_case.reference), "ckpt"))
    outputs, stops = [], []
    for k in range(KILLS):
        server = start_job_server("flink", tmp_path / f"job-server-{k}")
        out = str(tmp_path / f"out-{k}")
        outputs.append(out)
        env = launch_env(
            "flink", server, tiny_model, clean_case.input, out, ckpt, RESUME="1" if k else "0"
        )
        left = round(files * _left(ckpt, clean_case.chunks))
        before = commits_made(ckpt)
        with open(tmp_path / f"job-{k}.log", "wb") as log:
            proc = subprocess.Popen(
                launch_cmd("flink"), env=env, stdout=log, stderr=log, start_new_session=True
            )
        stops.append(_stop_at_random(rng, server, proc, ckpt, left, before))
    print(f"stops: {stops}")
    server = start_job_server("flink", tmp_path / "job-server-final")
    final = str(tmp_path / "out-final")
    try:
        env = launch_env("flink", server, tiny_model, clean_case.input, final, ckpt, RESUME="1")
        run(launch_cmd("flink"), env)
    finally:
        server.stop()
    verdict = judge(clean_case.reference, [*outputs, final])
    print(f"verdict: {verdict}")
    assert verdict.ok, str(verdict)
    assert any(rc != 0 for _, rc in stops), f"no kill landed while a job ran: {stops}"


def test_two_concurrent_resumes_on_flink_never_write_a_chunk_twice(
    flink_job_server, clean_case, tiny_model, tmp_path
):
    ckpt = str(tmp_path / "ckpt")
    outs = [str(tmp_path / f"out-{i}") for i in range(2)]
    procs = []
    for i, out in enumerate(outs):
        env = launch_env(
            "flink", flink_job_server, tiny_model, clean_case.input, out, ckpt, RESUME="1"
        )
        with open(tmp_path / f"job-{i}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    launch_cmd("flink"), env=env, stdout=log, stderr=log, start_new_session=True
                )
            )
    try:
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    logs = [(tmp_path / f"job-{i}.log").read_text(errors="replace") for i in range(2)]
    # Whatever one of them could not finish (fenced, or failed), a later resume completes.
    final = str(tmp_path / "out-final")
    env = launch_env(
        "flink", flink_job_server, tiny_model, clean_case.input, final, ckpt, RESUME="1"
    )
    run(launch_cmd("flink"), env)
    verdict = judge(clean_case.reference, [*outs, final])
    fenced = [Counter(d[2] for d in dead_letters(out))["fenced"] for out in outs]
    wrote = [len(os.listdir(os.path.join(out, "results"))) for out in outs]
    print(f"concurrent resumes: exit {codes}, fenced dead letters {fenced}, result files {wrote}")
    assert verdict.ok, str(verdict)
    # The two jobs did run at once: each wrote results, or one was fenced by the other.
    assert all(wrote) or any(fenced), (fenced, wrote)
    failed = [log for code, log in zip(codes, logs, strict=True) if code != 0]
    assert codes == [0, 0], "\n".join(log[-2000:] for log in failed)
