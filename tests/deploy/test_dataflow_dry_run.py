"""The Dataflow runner translates the embed job offline (``--dry_run=True``, no credentials).

In dry-run mode `DataflowRunner.run_pipeline` builds the portable pipeline proto and the Dataflow
`Job` and returns before creating a client or staging anything.  The job's worker `Environment`
(experiments, service options, machine type, container images) is only assembled at submission,
so the tests build it with Beam's own `apiclient.Environment` from the dry-run job: that is the
same code the real submission runs, minus the upload.

The embed job is built exactly as users launch it: `deploy/dataflow/launch.sh` prints its command
(PRINT_ONLY=1), and the tests run that command's `submit.py` in process with ``--dry_run=True``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.coders import BytesCoder, VarIntCoder
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

apiclient = pytest.importorskip(
    "apache_beam.runners.dataflow.internal.apiclient",
    reason="the Dataflow dry run needs apache-beam[gcp] (make test installs the gcp extra)",
)

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "deploy" / "dataflow" / "launch.sh"
SUBMIT = ROOT / "deploy" / "dataflow" / "submit.py"

PROJECT = "linstream-test"
BUCKET = "gs://linstream-test-bucket"
IMAGE = "us-central1-docker.pkg.dev/linstream-test/linstream/linstream-sdk:0.1.0"
IMAGE_GPU = "us-central1-docker.pkg.dev/linstream-test/linstream/linstream-sdk-gpu:0.1.0"
ACCELERATOR = "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"
STATEFUL = "beam:requirement:pardo:stateful:v1"
PARDO = "beam:transform:pardo:v1"
OFFLINE = ["--dry_run=True", "--no_auth"]


# -- helpers ------------------------------------------------------------------------------------


def _environment(job: Any) -> Any:
    """The worker Environment proto that submitting this dry-run job would send."""
    return apiclient.Environment(
        packages=[],
        options=job.options,
        environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url=f"{BUCKET}/linstream/staging/pipeline.pb",
        proto_pipeline=job.proto_pipeline,
    ).proto


def _stateful_pardos(pipeline_proto: Any) -> list[tuple[str, Any]]:
    out = []
    for t in pipeline_proto.components.transforms.values():
        if t.spec.urn != PARDO:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
        if payload.state_specs or payload.timer_family_specs:
            out.append((t.unique_name, payload))
    return out


def _docker_images(pipeline_proto: Any) -> set[str]:
    return {
        beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image
        for env in pipeline_proto.components.environments.values()
    }


def _launch_args(env: dict[str, str]) -> list[str]:
    """The command deploy/dataflow/launch.sh would run, as a list of arguments."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PRINT_ONLY": "1", **env}
    out = subprocess.run(
        ["bash", str(LAUNCH)], env=full, capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    assert out[1].endswith("deploy/dataflow/submit.py"), out[:2]
    return out


def _submit_module() -> Any:
    spec = importlib.util.spec_from_file_location("linstream_deploy_submit", SUBMIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the harness, on a stateful pipeline of our own -------------------------------------------


_COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
_SEEN = BagStateSpec("seen", BytesCoder())
_FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)
_COUNT_PARAM = beam.DoFn.StateParam(_COUNT)
_SEEN_PARAM = beam.DoFn.StateParam(_SEEN)
_FLUSH_PARAM = beam.DoFn.TimerParam(_FLUSH)


class _CountPerKey(beam.DoFn):
    """A tiny stateful DoFn: bag + read-modify-write state and an event-time timer."""

    def process(
        self,
        kv: tuple[str, bytes],
        count: Any = _COUNT_PARAM,
        seen: Any = _SEEN_PARAM,
        flush: Any = _FLUSH_PARAM,
    ) -> Any:
        count.write((count.read() or 0) + 1)
        seen.add(kv[1])
        flush.set(0)
        yield kv[0]

    @on_timer(_FLUSH)
    def on_flush(self, count: Any = _COUNT_PARAM) -> Any:
        count.clear()
        return []


@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "streaming"])
def test_dry_run_harness_sees_state_timers_image_and_experiments(streaming: bool) -> None:
    argv = [
        "--runner=DataflowRunner",
        f"--project={PROJECT}",
        "--region=us-central1",
        f"--temp_location={BUCKET}/tmp",
        "--sdk_location=container",
        f"--sdk_container_image={IMAGE}",
        "--experiments=use_runner_v2",
        "--machine_type=g2-standard-4",
        f"--dataflow_service_options={ACCELERATOR}",
        *OFFLINE,
    ] + (["--streaming"] if streaming else [])
    p = beam.Pipeline(options=PipelineOptions(argv))
    _ = p | beam.Create([("a", b"x"), ("b", b"y")]) | beam.ParDo(_CountPerKey())
    job = p.run().job
    expected = "JOB_TYPE_STREAMING" if streaming else "JOB_TYPE_BATCH"
    assert job.proto.type_.name == expected

    proto = job.proto_pipeline
    assert STATEFUL in proto.requirements
    (name, payload), *others = _stateful_pardos(proto)
    assert not others and "_CountPerKey" in name
    assert set(payload.state_specs) == {"count", "seen"}
    assert payload.state_specs["count"].HasField("read_modify_write_spec")
    assert payload.state_specs["seen"].HasField("bag_spec")
    (timer,) = payload.timer_family_specs.values()
    assert timer.time_domain == beam_runner_api_pb2.TimeDomain.EVENT_TIME
    assert _docker_images(proto) == {IMAGE}

    env = _environment(job)
    assert "use_runner_v2" in env.experiments
    assert list(env.service_options) == [ACCELERATOR]
    (pool,) = env.worker_pools
    assert pool.machine_type == "g2-standard-4"
    assert pool.worker_harness_container_image == IMAGE
    if streaming:
        assert "enable_streaming_engine" in env.experiments


# -- the embed job, as deploy/dataflow/launch.sh submits it -------------------------------------


@pytest.fixture(scope="module")
def chunk_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local chunk file: the dry run checks that the input glob matches, offline."""
    from linstream.pipeline.elements import Chunk
    from linstream.pipeline.io import write_chunk_file

    path = tmp_path_factory.mktemp("chunks") / "chunks.parquet"
    chunks = [Chunk("s0", i, np.arange(8, dtype=np.int32) + i, final=i == 1) for i in range(2)]
    write_chunk_file(str(path), chunks)
    return str(path)


def _dry_run_embed(env: dict[str, str]) -> tuple[list[str], Any]:
    args = _launch_args({"PROJECT": PROJECT, "REGION": "us-central1", "BUCKET": BUCKET, **env})
    result = _submit_module().main(args[2:] + OFFLINE)
    return args, result.job


def _assert_embed_stage(job: Any) -> Any:
    """Check the stateful embed stage; return it (the stage in its DoFn) as the workers will
    unpickle it."""
    proto = job.proto_pipeline
    assert STATEFUL in proto.requirements, list(proto.requirements)
    stages = [(n, p) for n, p in _stateful_pardos(proto) if "OrderAndApply" in n]
    assert len(stages) == 1, [n for n, _ in _stateful_pardos(proto)]
    _, payload = stages[0]
    kinds = {spec.WhichOneof("spec") for spec in payload.state_specs.values()}
    assert {"read_modify_write_spec", "bag_spec"} <= kinds, kinds
    assert payload.timer_family_specs, "the idle timer is missing"
    stage = pickler.loads(payload.do_fn.payload)[0].stage
    # The checkpoint store on GCS is part of the stage.
    assert stage.config.checkpoint_dir == f"{BUCKET}/linstream/checkpoints"
    return stage


def test_embed_batch_job_translates_for_cpu_workers(chunk_file: str) -> None:
    args, job = _dry_run_embed({"IMAGE": IMAGE, "INPUT": chunk_file})
    assert "--experiments=use_runner_v2" in args
    assert job.proto.type_.name == "JOB_TYPE_BATCH"
    assert _assert_embed_stage(job).step.backend == "numba"
    assert _docker_images(job.proto_pipeline) == {IMAGE}

    env = _environment(job)
    assert "use_runner_v2" in env.experiments
    assert not list(env.service_options)
    (pool,) = env.worker_pools
    assert pool.machine_type == "n2-standard-4"
    assert pool.worker_harness_container_image == IMAGE
    assert [c.container_image for c in pool.sdk_harness_container_images] == [IMAGE]
    assert env.temp_storage_prefix.startswith("storage.googleapis.com/linstream-test-bucket/")


def test_embed_streaming_job_translates_for_gpu_workers() -> None:
    sub = f"projects/{PROJECT}/subscriptions/chunks"
    args, job = _dry_run_embed({"IMAGE": IMAGE_GPU, "GPU": "1", "PUBSUB_SUBSCRIPTION": sub})
    assert "--streaming" in args and "--backend=cupy" in args
    assert job.proto.type_.name == "JOB_TYPE_STREAMING"
    assert _assert_embed_stage(job).step.backend == "cupy"
    proto = job.proto_pipeline
    reads = [t for t in proto.components.transforms.values() if "ReadPubSub" in t.unique_name]
    assert reads, "no Pub/Sub read in the streaming job"
    assert any(sub.encode() in t.spec.payload for t in reads)
    assert _docker_images(proto) == {IMAGE_GPU}

    env = _environment(job)
    assert {"use_runner_v2", "enable_streaming_engine"} <= set(env.experiments)
    assert "no_use_multiple_sdk_containers" in env.experiments
    assert "use_multiple_sdk_containers" not in env.experiments
    assert list(env.service_options) == [ACCELERATOR]
    (pool,) = env.worker_pools
    assert pool.machine_type == "g2-standard-4"
    assert pool.worker_harness_container_image == IMAGE_GPU


def test_launch_script_refuses_missing_settings() -> None:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PRINT_ONLY": "1"}
    run = subprocess.run(["bash", str(LAUNCH)], env=base, capture_output=True, text=True)
    assert run.returncode != 0 and "PROJECT" in run.stderr
    full = {**base, "PROJECT": PROJECT, "REGION": "r", "BUCKET": BUCKET, "IMAGE": IMAGE}
    run = subprocess.run(["bash", str(LAUNCH)], env=full, capture_output=True, text=True)
    assert run.returncode == 2 and "INPUT" in run.stderr
    run = subprocess.run(
        ["bash", str(LAUNCH)], env={**full, "BUCKET": "my-bucket"}, capture_output=True, text=True
    )
    assert run.returncode == 2 and "gs://" in run.stderr


def test_linstream_embed_launches_a_gpu_job_from_a_machine_without_a_gpu(
    chunk_file: str, tmp_path: Path
) -> None:
    """`linstream embed --runner DataflowRunner --backend cupy` is not refused on the launching
    machine (the workers have the GPUs and check theirs); a local runner still refuses."""
    from linstream.ops.backend import cupy_unavailable_reason

    if cupy_unavailable_reason() is None:
        pytest.skip("this machine has a GPU: nothing to refuse either way")
    args = _launch_args(
        {
            "PROJECT": PROJECT,
            "REGION": "us-central1",
            "BUCKET": BUCKET,
            "IMAGE": IMAGE_GPU,
            "GPU": "1",
            "INPUT": chunk_file,
        }
    )
    assert "--backend=cupy" in args and "--runner=DataflowRunner" in args
    linstream = str(Path(sys.executable).with_name("linstream"))
    # Local output and store: the dry run reads and writes nothing there, and needs no bucket.
    local = [f"--output={tmp_path / 'out'}", f"--checkpoint-dir={tmp_path / 'ckpt'}"]
    argv = [linstream, "embed", *args[2:], *local, *OFFLINE]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no usable GPU" not in proc.stderr
    assert "handed to DataflowRunner" in proc.stdout, proc.stdout
    here = [a for a in argv if not a.startswith("--runner=")] + ["--runner=FnApiRunner"]
    proc = subprocess.run(here, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--backend cupy: no usable GPU here" in proc.stderr
