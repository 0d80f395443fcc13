"""Run `linstream embed` with a fault injected (helpers/fault_cli.py): freeze a job at a chosen
step of its commit protocol, run other jobs meanwhile, then let it go on (or kill it)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["FAULT_CLI", "Frozen", "fault_env", "with_faults"]

TESTS = str(Path(__file__).resolve().parents[1])
FAULT_CLI = [sys.executable, "-m", "helpers.fault_cli"]


def fault_env(**faults: str) -> dict[str, str]:
    """The environment of a `helpers.fault_cli` process: ``tests/`` importable, and the
    faults (``freeze="before-commit:N:FLAG"``, ``clock_skew_s="3600"``)."""
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, env.get("PYTHONPATH")) if p)
    for key, value in faults.items():
        env[f"LINSTREAM_FAULT_{key.upper()}"] = value
    return env


def with_faults(cmd: list[str]) -> list[str]:
    """A ``python -m linstream.pipeline.app.cli ...`` command line run through
    `helpers.fault_cli` instead."""
    assert cmd[1:3] == ["-m", "linstream.pipeline.app.cli"], cmd
    return [*FAULT_CLI, *cmd[3:]]


#: Jobs started here and maybe still running or frozen: killed when the test process ends, so
#: that a test failing half-way leaves no frozen process behind.
_LIVE: set[Frozen] = set()


@atexit.register
def _kill_leftovers() -> None:
    for job in list(_LIVE):
        job.kill()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


class Frozen:
    """A job started with ``LINSTREAM_FAULT_FREEZE``, waited for until it stops itself.  Use it
    as a context manager: leaving the block kills the job if it still runs (or is frozen)."""

    def __init__(self, cmd: list[str], flag: str, log: str, **faults: str) -> None:
        self.flag = flag
        self._log = open(log, "ab")  # noqa: SIM115 (closed in wait/kill)
        self.proc = subprocess.Popen(
            with_faults(cmd),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=fault_env(**faults),
            start_new_session=True,
        )
        self.info: dict[str, Any] = {}
        _LIVE.add(self)

    def wait_frozen(self, timeout: float = 180.0) -> dict[str, Any]:
        """The flag's contents, once the process has stopped itself."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.flag):
            if self.proc.poll() is not None:
                msg = f"the job ended (exit {self.proc.returncode}) before it froze"
                raise AssertionError(msg)
            if time.monotonic() > deadline:
                self.kill()
                msg = f"the job did not freeze within {timeout} s"
                raise AssertionError(msg)
            time.sleep(0.01)
        while _state(self.proc.pid) != "T":
            if time.monotonic() > deadline:
                self.kill()
                msg = "the job wrote its flag but did not stop"
                raise AssertionError(msg)
            time.sleep(0.005)
        with open(self.flag) as f:
            self.info = json.load(f)
        return self.info

    def resume(self, timeout: float = 300.0) -> int:
        """SIGCONT, then its exit status."""
        os.killpg(self.proc.pid, signal.SIGCONT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        finally:
            self._log.close()

    def stop(self, sig: int, timeout: float = 120.0) -> int:
        """Send ``sig`` to the frozen job (then SIGCONT, so that it can handle it, unless it is
        SIGKILL); its exit status."""
        os.killpg(self.proc.pid, sig)
        if sig != signal.SIGKILL:
            os.killpg(self.proc.pid, signal.SIGCONT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()

    def __enter__(self) -> Frozen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()  # a test that failed half-way leaves no frozen process behind
