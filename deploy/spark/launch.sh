#!/usr/bin/env bash
# Run the linstream embed job as a BATCH job on Spark through Beam's portable Spark runner.
#
# Beam's portable Spark runner runs batch pipelines.  It does not run streaming pipelines with
# state and timers, which the streaming embed job needs: use Dataflow or Flink for --streaming.
#
# The job server is Beam's Spark 3 job server image, started here unless JOB_ENDPOINT is set:
#   docker run --rm --net=host apache/beam_spark3_job_server:2.77.0 \
#     --spark-master-url=spark://SPARK_MASTER:7077
#
# Required environment:
#   SPARK_MASTER_URL  spark://host:7077 (or local[4] for a job server with an embedded Spark)
#   INPUT             chunk Parquet files the Spark workers can read
#   OUTPUT            results directory the workers can write
#   CHECKPOINT_DIR    checkpoint store root the workers can write
# Optional:
#   JOB_ENDPOINT      a running job server (default: start one with docker on localhost:8099)
#   ENVIRONMENT_TYPE  DOCKER (default; the Spark workers start IMAGE) or EXTERNAL (a Beam
#                     worker pool, ENVIRONMENT_CONFIG=host:50000) or LOOPBACK (local tests)
#   IMAGE             the linstream SDK image (required for DOCKER)
#   MODEL, RESUME=1, PRINT_ONLY=1
set -euo pipefail

: "${SPARK_MASTER_URL:?set SPARK_MASTER_URL, e.g. spark://spark-master:7077}"
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
PYTHON="${PYTHON:-python3}"
BEAM_VERSION="${BEAM_VERSION:-2.77.0}"
JOB_SERVER_IMAGE="apache/beam_spark3_job_server:$BEAM_VERSION"
ENVIRONMENT_TYPE="${ENVIRONMENT_TYPE:-DOCKER}"

args=(
  "$PYTHON" "$here/../dataflow/submit.py"
  --runner=PortableRunner
  --job_endpoint="${JOB_ENDPOINT:-localhost:8099}"
  --input="$INPUT"
  --output="$OUTPUT"
  --checkpoint-dir="$CHECKPOINT_DIR"
  --model="${MODEL:-builtin:default}"
  --backend=numba
  --wait
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
    docker stop "$job_server" >/dev/null || true
  fi
}
trap cleanup EXIT
if [ -z "${JOB_ENDPOINT:-}" ]; then
  job_server="$(docker run -d --rm --net=host "$JOB_SERVER_IMAGE" \
    --spark-master-url="$SPARK_MASTER_URL" --job-port=8099 --artifact-port=8098)"
  # Wait for the job service port.
  for _ in $(seq 1 60); do
    if (exec 3<>/dev/tcp/127.0.0.1/8099) 2>/dev/null; then
      break
    fi
    sleep 1
  done
fi
"${args[@]}"
