"""Engine test fixtures: the fetched engines, one Flink job server for the session, the shared
input and its FnApiRunner reference run.

The engine tests run last in a session (they wait for deploy/engines/fetch.sh, which `make test`
starts in the background first, so the slow fetches overlap the rest of the suite).  An engine
that cannot be fetched here (no Java, Maven or Go) skips its tests, naming what is missing,
unless LINSTREAM_ENGINES=require (make test, CI), where it fails them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.engine_servers import Server, need, start_job_server, stop_all

HERE = Path(__file__).resolve().parent


# tryfirst: pytest-xdist reads the group marks in this same hook (and names each test by them)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    """Engine tests go last, in their files' order (see the module docstring), and are of the
    end-to-end tier (`make check` leaves them out, `make test` runs them)."""
    mine = [i for i in items if HERE in Path(str(i.path)).parents]
    for item in mine:
        item.add_marker(pytest.mark.e2e)
        item.add_marker(pytest.mark.xdist_group("engines"))  # one worker: one set of servers
    if mine:
        rest = [i for i in items if HERE not in Path(str(i.path)).parents]
        items[:] = rest + mine


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    stop_all()  # whatever a failed fixture left running


@pytest.fixture(scope="session")
def flink_job_server(tmp_path_factory: Any) -> Iterator[Server]:
    """Beam's Flink job server (embedded Flink cluster), started once per session by
    deploy/flink/job-server.sh; its built-in expansion service serves the Kafka source."""
    need("flink")
    server = start_job_server("flink", tmp_path_factory.mktemp("flink-job-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: Any) -> str:
    from helpers.models import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny.safetensors"))


def _case(tmp_path_factory: Any, model: str, seed: int, bad: bool) -> Any:
    from helpers.engine_jobs import Case, embed_cmd, run, write_case_input

    print(f"engine case seed {seed}")
    root = tmp_path_factory.mktemp("case")
    inp = str(root / "in.parquet")
    chunks, dead = write_case_input(Path(inp), seed, bad=bad)
    ref = str(root / "fn-api-runner")
    run(embed_cmd(model, inp, ref, str(root / "ckpt"), "--runner=FnApiRunner"))
    return Case(inp, ref, chunks, dead)


@pytest.fixture(scope="session")
def case(tmp_path_factory: Any, tiny_model: str) -> Any:
    """The input every engine runs (seed printed) and its FnApiRunner run, with checkpoints."""
    return _case(tmp_path_factory, tiny_model, 2026, bad=True)


@pytest.fixture(scope="session")
def clean_case(tmp_path_factory: Any, tiny_model: str) -> Any:
    """An input without rejected chunks (for jobs resumed until nothing is left to apply: a job
    whose chunks all went to the dead letters exits 3), and its FnApiRunner run."""
    return _case(tmp_path_factory, tiny_model, 2027, bad=False)
