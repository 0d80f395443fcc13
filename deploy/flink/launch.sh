#!/usr/bin/env bash
# Run `linstream embed` on Flink through Beam's portable runner and a Beam Flink job server; waits
# for a batch job and prints its summary (a streaming job runs until you stop it: Ctrl-C stops
# waiting; with LOOPBACK workers it also cancels the job, which cannot go on without them, and
# otherwise the job goes on on Flink).
#
# On this machine (an embedded Flink cluster in the job server's JVM; Java 17, no Docker):
#   deploy/flink/job-server.sh &        # Beam's Flink job server on localhost:8099 (8098, 8097)
#   ENVIRONMENT_TYPE=LOOPBACK OUTPUT=out CHECKPOINT_DIR=ckpt INPUT='data/*.parquet' deploy/flink/launch.sh
#   ENVIRONMENT_TYPE=LOOPBACK OUTPUT=out CHECKPOINT_DIR=ckpt KAFKA_BOOTSTRAP=127.0.0.1:9092 \
#     KAFKA_TOPIC=chunks deploy/flink/launch.sh
# This is what the project's engine tests run (tests/engines/).
#
# On the Kubernetes cluster of deploy/flink/k8s/flink-beam.yaml, forward the job server first:
#   kubectl -n linstream port-forward svc/beam-job-server 8099:8099 8098:8098
#
# Required environment:
#   OUTPUT           results directory the workers can write (gs://, s3:// or a shared path)
#   CHECKPOINT_DIR   checkpoint store root the workers can write
# Source (one of):
#   INPUT=...parquet                                batch
#   KAFKA_BOOTSTRAP=host:9092 KAFKA_TOPIC=chunks    streaming (Beam's cross-language Kafka I/O)
# Optional:
#   JOB_ENDPOINT       default localhost:8099 (the job server)
#   ARTIFACT_ENDPOINT  default localhost:8098
#   ENVIRONMENT_TYPE   EXTERNAL (default: the worker-pool sidecar at localhost:50000 in each
#                      taskmanager pod), LOOPBACK (the Python workers run in this process: a job
#                      server on this machine), or DOCKER (taskmanagers start IMAGE with docker)
#   IMAGE              SDK image for DOCKER (required then)
#   EXPANSION_ENDPOINT Kafka: the expansion service (default with LOOPBACK: the job server's
#                      built-in one, localhost:8097; otherwise Beam starts its own)
#   JAVA_ENVIRONMENT   Kafka: where the Java harness runs (default with LOOPBACK: EMBEDDED, in
#                      the Flink task managers; otherwise Java's default, DOCKER)
#   PARALLELISM        default 2        CHECKPOINTING_INTERVAL_MS  default 60000 (streaming)
#   EXECUTION_RETRIES, EXECUTION_RETRY_DELAY_MS  restarts of a failed job with LOOPBACK workers
#                      (default 2, 2000 ms; otherwise Flink's default)
#   MODEL, RESUME=1, PRINT_ONLY=1 (print the command, one argument a line)
#   LINSTREAM          the linstream command (default: linstream on PATH)
# Further arguments are passed on (linstream or Beam options).
set -euo pipefail

: "${OUTPUT:?set OUTPUT to a results directory the Flink workers can write}"
: "${CHECKPOINT_DIR:?set CHECKPOINT_DIR to a checkpoint store root the Flink workers can write}"

ENVIRONMENT_TYPE="${ENVIRONMENT_TYPE:-EXTERNAL}"

args=(
  "${LINSTREAM:-linstream}" embed
  --runner=PortableRunner
  --job_endpoint="${JOB_ENDPOINT:-localhost:8099}"
  --artifact_endpoint="${ARTIFACT_ENDPOINT:-localhost:8098}"
  --parallelism="${PARALLELISM:-2}"
  --output="$OUTPUT"
  --checkpoint-dir="$CHECKPOINT_DIR"
  --model="${MODEL:-builtin:default}"
  --backend=numba
)

case "$ENVIRONMENT_TYPE" in
  EXTERNAL) args+=(--environment_type=EXTERNAL --environment_config=localhost:50000) ;;
  LOOPBACK)
    # The Python workers live in this command: once it stops, a restarted job cannot get them
    # back, and Flink (with checkpoints) would restart it without end on the job server.
    args+=(--environment_type=LOOPBACK
      --number_of_execution_retries="${EXECUTION_RETRIES:-2}"
      --execution_retry_delay="${EXECUTION_RETRY_DELAY_MS:-2000}")
    ;;
  DOCKER)
    : "${IMAGE:?set IMAGE to the linstream SDK image for ENVIRONMENT_TYPE=DOCKER}"
    args+=(--environment_type=DOCKER --environment_config="$IMAGE")
    ;;
  *)
    echo "launch.sh: ENVIRONMENT_TYPE must be EXTERNAL, LOOPBACK or DOCKER, got '$ENVIRONMENT_TYPE'" >&2
    exit 2
    ;;
esac

if [ -n "${INPUT:-}" ]; then
  args+=(--input="$INPUT")
elif [ -n "${KAFKA_BOOTSTRAP:-}" ]; then
  : "${KAFKA_TOPIC:?set KAFKA_TOPIC with KAFKA_BOOTSTRAP}"
  args+=(
    --streaming
    --kafka_bootstrap="$KAFKA_BOOTSTRAP"
    --kafka_topic="$KAFKA_TOPIC"
    --checkpointing_interval="${CHECKPOINTING_INTERVAL_MS:-60000}"
    # Without it, a bundle still open when a checkpoint begins has its outputs held back while
    # its watermark goes on: the Kafka source's first bundle can be held so, and the job then
    # waits for ever, RUNNING, for input it never reads.
    --finish_bundle_before_checkpointing
  )
  if [ "$ENVIRONMENT_TYPE" = "LOOPBACK" ]; then
    EXPANSION_ENDPOINT="${EXPANSION_ENDPOINT:-localhost:8097}"
    JAVA_ENVIRONMENT="${JAVA_ENVIRONMENT:-EMBEDDED}"
  fi
  if [ -n "${EXPANSION_ENDPOINT:-}" ]; then
    args+=(--kafka_expansion_service="$EXPANSION_ENDPOINT")
  fi
  if [ -n "${JAVA_ENVIRONMENT:-}" ]; then
    args+=(--default_environment_type="$JAVA_ENVIRONMENT")
  fi
else
  echo "launch.sh: set INPUT (batch) or KAFKA_BOOTSTRAP and KAFKA_TOPIC (streaming)" >&2
  exit 2
fi

if [ "${RESUME:-0}" = "1" ]; then
  args+=(--resume)
fi
args+=("$@")

if [ "${PRINT_ONLY:-0}" = "1" ]; then
  printf '%s\n' "${args[@]}"
  exit 0
fi
exec "${args[@]}"
