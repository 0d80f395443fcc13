#!/usr/bin/env bash
# Build the linstream Flex Template spec, or run a job from it.
#
#   deploy/dataflow/flex_template.sh build   # writes the template spec to $TEMPLATE_PATH
#   deploy/dataflow/flex_template.sh run     # starts a job from it
#
# Required environment:
#   PROJECT, REGION, BUCKET (gs://...), LAUNCHER_IMAGE (build), IMAGE (run: SDK worker image)
# Optional:
#   TEMPLATE_PATH    default $BUCKET/linstream/templates/linstream-embed.json
#   INPUT | PUBSUB_SUBSCRIPTION | PUBSUB_TOPIC   the source (as for launch.sh)
#   GPU=1, MACHINE_TYPE, MAX_WORKERS, MODEL, OUTPUT, CHECKPOINT_DIR, RESUME=1, JOB_NAME
set -euo pipefail

: "${PROJECT:?set PROJECT to your GCP project id}"
: "${REGION:?set REGION to a Dataflow region, e.g. us-central1}"
: "${BUCKET:?set BUCKET to gs://your-bucket}"
BUCKET="${BUCKET%/}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE_PATH="${TEMPLATE_PATH:-$BUCKET/linstream/templates/linstream-embed.json}"
cmd="${1:-}"

case "$cmd" in
  build)
    : "${LAUNCHER_IMAGE:?set LAUNCHER_IMAGE to the image from deploy/dataflow/flex_template/Dockerfile}"
    gcloud dataflow flex-template build "$TEMPLATE_PATH" \
      --project "$PROJECT" \
      --image "$LAUNCHER_IMAGE" \
      --sdk-language PYTHON \
      --metadata-file "$here/flex_template/metadata.json"
    echo "template spec: $TEMPLATE_PATH"
    ;;
  run)
    : "${IMAGE:?set IMAGE to the SDK worker image (deploy/dataflow/Dockerfile or Dockerfile.gpu)}"
    GPU="${GPU:-0}"
    # '~' separates parameters (gcloud's ^~^ syntax): values may hold ',' and ';'.
    params="output=${OUTPUT:-$BUCKET/linstream/out}"
    params+="~checkpoint_dir=${CHECKPOINT_DIR:-$BUCKET/linstream/checkpoints}"
    params+="~model=${MODEL:-builtin:default}"
    params+="~sdk_container_image=$IMAGE"
    params+="~sdk_location=container"
    extra=()
    if [ -n "${INPUT:-}" ]; then
      params+="~input=$INPUT"
    elif [ -n "${PUBSUB_SUBSCRIPTION:-}" ]; then
      params+="~streaming=true~pubsub_subscription=$PUBSUB_SUBSCRIPTION"
      extra+=(--enable-streaming-engine)
    elif [ -n "${PUBSUB_TOPIC:-}" ]; then
      params+="~streaming=true~pubsub_topic=$PUBSUB_TOPIC"
      extra+=(--enable-streaming-engine)
    else
      echo "flex_template.sh: set INPUT (batch) or PUBSUB_SUBSCRIPTION / PUBSUB_TOPIC (streaming)" >&2
      exit 2
    fi
    if [ "$GPU" = "1" ]; then
      params+="~backend=cupy"
      params+="~dataflow_service_options=worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"
      experiments="use_runner_v2,no_use_multiple_sdk_containers"
      machine="${MACHINE_TYPE:-g2-standard-4}"
    else
      params+="~backend=numba"
      experiments="use_runner_v2"
      machine="${MACHINE_TYPE:-n2-standard-4}"
    fi
    if [ "${RESUME:-0}" = "1" ]; then
      params+="~resume=true"
    fi
    gcloud dataflow flex-template run "${JOB_NAME:-linstream-embed-$(date -u +%Y%m%d-%H%M%S)}" \
      --project "$PROJECT" \
      --region "$REGION" \
      --template-file-gcs-location "$TEMPLATE_PATH" \
      --temp-location "$BUCKET/linstream/tmp" \
      --staging-location "$BUCKET/linstream/staging" \
      --worker-machine-type "$machine" \
      --max-workers "${MAX_WORKERS:-10}" \
      --additional-experiments "$experiments" \
      "${extra[@]}" \
      --parameters "^~^$params"
    ;;
  *)
    echo "usage: $0 build|run   (see the header of this file for the environment)" >&2
    exit 2
    ;;
esac
