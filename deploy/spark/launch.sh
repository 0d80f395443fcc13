#!/usr/bin/env bash
# Run `linstream embed` as a BATCH job on Spark through Beam's portable Spark runner; waits for
# the job and prints its summary.
#
# Beam's portable Spark runner runs batch pipelines.  It does not run streaming pipelines with
# state and timers, which the streaming embed job needs: use Dataflow or Flink for --streaming.
#
# Unless JOB_ENDPOINT names a running job server, this script starts Beam's Spark job server
# (deploy/spark/job-server.sh: the jars deploy/engines/fetch.sh assembles, Java 17, no Docker)
# for SPARK_MASTER_URL on localhost:8099 and stops it at the end.  On this machine:
#   SPARK_MASTER_URL='local[2]' ENVIRONMENT_TYPE=LOOPBACK INPUT='data/*.parquet' OUTPUT=out \
#     CHECKPOINT_DIR=ckpt deploy/spark/launch.sh
# This is what the project's engine tests run (tests/engines/), with their own job server.
#
# Required environment:
#   SPARK_MASTER_URL  spark://host:7077 (or local[2] for a job server with an embedded Spark)
#   INPUT             chunk Parquet files the Spark workers can read
#   OUTPUT            results directory the workers can write
#   CHECKPOINT_DIR    checkpoint store root the workers can write
# Optional:
#   JOB_ENDPOINT      a running job server (default: start one as above on localhost:8099)
#   ENVIRONMENT_TYPE  DOCKER (default; the Spark workers start IMAGE) or EXTERNAL (a Beam
#                     worker pool, ENVIRONMENT_CONFIG=host:50000) or LOOPBACK (the Python
#                     workers run in this process: a job server on this machine)
#   IMAGE             the linstream SDK image (required for DOCKER)
#   MODEL, RESUME=1, PRINT_ONLY=1, LINSTREAM (the linstream command, default: on PATH)
set -euo pipefail

: "${SPARK_MASTER_URL:?set SPARK_MASTER_URL, e.g. spark://spark-master:7077 or local[2]}"
: "${INPUT:?set INPUT to chunk Parquet files (the Spark runner is batch only)}"
: "${OUTPUT:?set OUTPUT to a results directory the Spark workers can write}"
: "${CHECKPOINT_DIR:?set CHECKPOINT_DIR to a checkpoint store root}"

for a in "$@"; do
  case "$a" in
    --streaming|--streaming=*)
      echo "launch.sh: Beam's portable Spark runner does not support streaming with state and timers; use deploy/flink or deploy/dataflow" >&2
      exit 2
      ;;
  esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ENVIRONMENT_TYPE="${ENVIRONMENT_TYPE:-DOCKER}"

args=(
  "${LINSTREAM:-linstream}" embed
  --runner=PortableRunner
  --job_endpoint="${JOB_ENDPOINT:-localhost:8099}"
  --input="$INPUT"
  --output="$OUTPUT"
  --checkpoint-dir="$CHECKPOINT_DIR"
  --model="${MODEL:-builtin:default}"
  --backend=numba
)
case "$ENVIRONMENT_TYPE" in
  DOCKER)
    : "${IMAGE:?set IMAGE to the linstream SDK image for ENVIRONMENT_TYPE=DOCKER}"
    args+=(--environment_type=DOCKER --environment_config="$IMAGE")
    ;;
  EXTERNAL)
    : "${ENVIRONMENT_CONFIG:?set ENVIRONMENT_CONFIG to the Beam worker pool host:port}"
    args+=(--environment_type=EXTERNAL --environment_config="$ENVIRONMENT_CONFIG")
    ;;
  LOOPBACK) args+=(--environment_type=LOOPBACK) ;;
  *) echo "launch.sh: ENVIRONMENT_TYPE must be DOCKER, EXTERNAL or LOOPBACK, got '$ENVIRONMENT_TYPE'" >&2; exit 2 ;;
esac
if [ "${RESUME:-0}" = "1" ]; then
  args+=(--resume)
fi
args+=("$@")

if [ "${PRINT_ONLY:-0}" = "1" ]; then
  printf '%s\n' "${args[@]}"
  exit 0
fi

job_server=""
cleanup() {
  if [ -n "$job_server" ]; then
    kill "$job_server" 2>/dev/null || true
    wait "$job_server" 2>/dev/null || true
  fi
}
trap cleanup EXIT
if [ -z "${JOB_ENDPOINT:-}" ]; then
  JOB_PORT=8099 ARTIFACT_PORT=8098 EXPANSION_PORT=8097 SPARK_MASTER_URL="$SPARK_MASTER_URL" \
    "$here/job-server.sh" &
  job_server=$!
  # Wait for the job service port (a connect, no bytes: gRPC logs stray bytes as errors).
  for _ in $(seq 1 120); do
    if (exec 3<>/dev/tcp/127.0.0.1/8099) 2>/dev/null; then
      break
    fi
    kill -0 "$job_server" 2>/dev/null || { echo "launch.sh: the Spark job server exited" >&2; exit 1; }
    sleep 1
  done
fi
"${args[@]}"
