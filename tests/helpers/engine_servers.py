"""Servers the engine tests start and stop: Beam's Flink and Spark job servers (the scripts in
deploy/), a Kafka broker, each a process group of its own, on free ports, bounded in time.

Every server is started through `start_server`, which records it; `stop_all` (called by the
fixtures' finalizers and once more at the end of the session) kills whatever is left, so no
server outlives the tests, also when a test fails.  At most two JVMs of the tests run at once
(the machine is shared): `start_server` refuses a third.

Beam's Java servers listen on every interface whatever --job-host says (its gRPC server factory
binds the port alone); clients here connect on loopback only, and Kafka and Prism listen on
127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "deploy" / "engines" / "fetch.sh"
#: JVMs the tests may run at once: a Kafka broker, the session's Flink job server and one more
#: (a job server of a test's own); more would mean one was left running.
MAX_JVMS = 3

#: Environment switch: "require" (make test, CI) fails a test whose engine cannot be fetched;
#: otherwise such a test is skipped, naming what is missing.
REQUIRE_ENV = "LINSTREAM_ENGINES"
#: Seconds a test waits for `fetch.sh` (which may be fetching in the background already).
FETCH_WAIT_ENV = "LINSTREAM_ENGINES_WAIT"


class EngineUnavailable(RuntimeError):
    """An engine's files could not be fetched here (no Java, Maven, Go, or network)."""


def engine_path(piece: str) -> str:
    """The fetched piece (a jar folder, or the prism binary), fetching it if needed; waits for a
    fetch already under way (fetch.sh locks each piece), at most $LINSTREAM_ENGINES_WAIT s."""
    tools = {"prism": ("go",), "kafka": ("java", "mvn")}.get(piece, ("java", "mvn"))
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        msg = f"{piece}: {', '.join(missing)} not installed"
        raise EngineUnavailable(msg)
    wait = float(os.environ.get(FETCH_WAIT_ENV, "1200"))
    try:
        done = subprocess.run(
            [str(FETCH), "--path", piece], capture_output=True, text=True, timeout=wait
        )
    except subprocess.TimeoutExpired as ex:
        msg = f"{piece}: deploy/engines/fetch.sh did not finish within {wait:.0f} s"
        raise EngineUnavailable(msg) from ex
    if done.returncode != 0:
        msg = f"{piece}: deploy/engines/fetch.sh failed: {done.stderr.strip()[-1500:]}"
        raise EngineUnavailable(msg)
    return done.stdout.strip().splitlines()[-1]


def need(piece: str) -> str:
    """The fetched piece's path, or skip the test (fail it under LINSTREAM_ENGINES=require)
    saying why it is not available."""
    import pytest

    try:
        return engine_path(piece)
    except EngineUnavailable as ex:
        if os.environ.get(REQUIRE_ENV) == "require":
            pytest.fail(f"engine not available: {ex}")
        pytest.skip(f"engine not available: {ex} (LINSTREAM_ENGINES=require makes this fail)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    """A connect-only probe (sends no bytes: a gRPC server logs a stack trace for stray bytes)."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Server:
    """A started server: its process (group leader), log and ports."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int] = field(default_factory=dict)
    jvm: bool = True
    started_s: float = 0.0
    #: Folders the server writes outside its log (a job server's staged artifacts, ~200 MB per
    #: Kafka job, and its JVM's temporary files, such as Flink's unpacked 22 MB RPC jar): removed
    #: when it stops, so that no run of the tests leaves them behind.
    scratch: list[Path] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def endpoint(self, port: str = "job") -> str:
        return f"localhost:{self.ports[port]}"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group (the server and anything it started)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``; reap the leader."""
        if self.alive:
            self.kill(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        self.kill(signal.SIGKILL)  # whatever is left of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for folder in self.scratch:
            shutil.rmtree(folder, ignore_errors=True)
        _STARTED.pop(id(self), None)

    def tail(self, n: int = 3000) -> str:
        """The end of the server's log, without Flink's warnings about long operator names."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(x for x in lines if "characters length limit" not in x)[-n:]


_STARTED: dict[int, Server] = {}


def live_jvms() -> int:
    return sum(1 for s in _STARTED.values() if s.jvm and s.alive)


def start_server(
    name: str,
    cmd: list[str],
    workdir: Path,
    ports: dict[str, int],
    *,
    ready_port: str = "job",
    env: dict[str, str] | None = None,
    jvm: bool = True,
    timeout_s: float = 120.0,
) -> Server:
    """Start ``cmd`` in a new session (own process group), output to ``workdir/<name>.log``;
    return once ``ports[ready_port]`` accepts connections (or fail, killing it)."""
    if jvm and live_jvms() >= MAX_JVMS:
        running = [s.name for s in _STARTED.values() if s.jvm and s.alive]
        msg = f"starting {name} would run a third JVM of the tests (running: {running})"
        raise RuntimeError(msg)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}-{uuid.uuid4().hex[:6]}.log"
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,  # Beam's boot writes files into the working directory
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    server = Server(name, proc, log, dict(ports), jvm)
    _STARTED[id(server)] = server
    deadline = t0 + timeout_s
    while time.monotonic() < deadline:
        if not server.alive:
            server.stop()
            msg = f"{name} exited with {proc.returncode} before listening:\n{server.tail()}"
            raise RuntimeError(msg)
        if port_open(ports[ready_port]):
            server.started_s = time.monotonic() - t0
            return server
        time.sleep(0.1)
    server.stop()
    msg = f"{name} was not listening on port {ports[ready_port]} after {timeout_s:.0f} s"
    raise RuntimeError(msg)


def stop_all() -> None:
    for server in list(_STARTED.values()):
        server.stop(grace_s=5.0)


# -- the job servers, as deploy/ starts them ---------------------------------------------------


def job_server_ports() -> dict[str, int]:
    return {"job": free_port(), "artifact": free_port(), "expansion": free_port()}


def start_job_server(engine: str, workdir: Path, **env: str) -> Server:
    """Beam's ``engine`` ("flink" or "spark") job server through deploy/<engine>/job-server.sh,
    staging its jobs' artifacts and its JVM's temporary files under ``workdir`` (removed when it
    stops)."""
    ports = job_server_ports()
    script = ROOT / "deploy" / engine / "job-server.sh"
    artifacts, jvm_tmp = workdir / "artifacts", workdir / "jvm-tmp"
    jvm_tmp.mkdir(parents=True, exist_ok=True)
    environ = {
        "JOB_PORT": str(ports["job"]),
        "ARTIFACT_PORT": str(ports["artifact"]),
        "EXPANSION_PORT": str(ports["expansion"]),
        "ARTIFACTS_DIR": str(artifacts),
        "JAVA_TMPDIR": str(jvm_tmp),  # Flink's unpacked RPC jar (22 MB a start), Spark's scratch
        "JAVA_HEAP": "1g",
        **env,
    }
    server = start_server(f"{engine}-job-server", [str(script)], workdir, ports, env=environ)
    server.scratch.extend([artifacts, jvm_tmp])
    return server


def job_states(server: Server) -> list[tuple[str, str]]:
    """Each job on a Beam job server, with its state name (for a failing test's message)."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2 as api
    from apache_beam.portability.api import beam_job_api_pb2_grpc as api_grpc

    try:
        with grpc.insecure_channel(server.endpoint()) as channel:
            jobs = api_grpc.JobServiceStub(channel).GetJobs(api.GetJobsRequest(), timeout=30)
            return [(j.job_name, api.JobState.Enum.Name(j.state)) for j in jobs.job_info]
    except grpc.RpcError as e:
        return [("(the job server did not answer)", str(e.code()))]
