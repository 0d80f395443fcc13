#!/usr/bin/env bash
# Submit the linstream embed job to Dataflow from this checkout (runner v2, custom container).
#
# Required environment:
#   PROJECT  GCP project id                 REGION  Dataflow region, e.g. us-central1
#   BUCKET   gs://bucket for temp, staging, output and checkpoints (no trailing slash)
#   IMAGE    the SDK container built from deploy/dataflow/Dockerfile (Dockerfile.gpu with GPU=1)
# Source (one of):
#   INPUT=gs://.../*.parquet                      batch job over chunk files
#   PUBSUB_SUBSCRIPTION=projects/P/subscriptions/S  streaming job (or PUBSUB_TOPIC=...)
#   KAFKA_BOOTSTRAP=host:9092 KAFKA_TOPIC=chunks      streaming job (cross-language Kafka)
# Optional:
#   GPU=1            NVIDIA L4 workers (g2-standard-4) with the cupy backend
#   MACHINE_TYPE     default n2-standard-4 (CPU) or g2-standard-4 (GPU)
#   MAX_WORKERS      default 10          MODEL  default builtin:default
#   OUTPUT           default $BUCKET/linstream/out
#   CHECKPOINT_DIR   default $BUCKET/linstream/checkpoints
#   RESUME=1         continue every sequence from its last committed checkpoint
#   JOB_NAME         default linstream-embed-<UTC time>
#   PRINT_ONLY=1     print the command (one argument a line) instead of running it
# Further arguments are passed on (linstream or Beam options), e.g. --checkpoint_every=32.
set -euo pipefail

: "${PROJECT:?set PROJECT to your GCP project id}"
: "${REGION:?set REGION to a Dataflow region, e.g. us-central1}"
: "${BUCKET:?set BUCKET to gs://your-bucket}"
: "${IMAGE:?set IMAGE to the SDK container image (see deploy/README.md, step 2)}"

case "$BUCKET" in
  gs://*) ;;
  *) echo "launch.sh: BUCKET must start with gs://, got '$BUCKET'" >&2; exit 2 ;;
esac
BUCKET="${BUCKET%/}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
GPU="${GPU:-0}"
OUTPUT="${OUTPUT:-$BUCKET/linstream/out}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:-$BUCKET/linstream/checkpoints}"
JOB_NAME="${JOB_NAME:-linstream-embed-$(date -u +%Y%m%d-%H%M%S)}"

args=(
  "$PYTHON" "$here/submit.py"
  --runner=DataflowRunner
  --project="$PROJECT"
  --region="$REGION"
  --job_name="$JOB_NAME"
  --temp_location="$BUCKET/linstream/tmp"
  --staging_location="$BUCKET/linstream/staging"
  --sdk_container_image="$IMAGE"
  --sdk_location=container
  --experiments=use_runner_v2
  --max_num_workers="${MAX_WORKERS:-10}"
  --output="$OUTPUT"
  --checkpoint-dir="$CHECKPOINT_DIR"
  --model="${MODEL:-builtin:default}"
)

if [ -n "${INPUT:-}" ]; then
  args+=(--input="$INPUT")
elif [ -n "${PUBSUB_SUBSCRIPTION:-}" ]; then
  args+=(--streaming --pubsub_subscription="$PUBSUB_SUBSCRIPTION")
elif [ -n "${PUBSUB_TOPIC:-}" ]; then
  args+=(--streaming --pubsub_topic="$PUBSUB_TOPIC")
elif [ -n "${KAFKA_BOOTSTRAP:-}" ]; then
  : "${KAFKA_TOPIC:?set KAFKA_TOPIC with KAFKA_BOOTSTRAP}"
  args+=(--streaming --kafka_bootstrap="$KAFKA_BOOTSTRAP" --kafka_topic="$KAFKA_TOPIC")
else
  echo "launch.sh: set INPUT (batch), PUBSUB_SUBSCRIPTION / PUBSUB_TOPIC or KAFKA_BOOTSTRAP (streaming)" >&2
  exit 2
fi

if [ "$GPU" = "1" ]; then
  # One NVIDIA L4 per worker; Dataflow installs the driver.  One SDK process per VM shares the
  # GPU instead of one process per vCPU each holding a CUDA context.
  args+=(
    --machine_type="${MACHINE_TYPE:-g2-standard-4}"
    "--dataflow_service_options=worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"
    --experiments=no_use_multiple_sdk_containers
    --backend=cupy
  )
else
  args+=(--machine_type="${MACHINE_TYPE:-n2-standard-4}" --backend=numba)
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
