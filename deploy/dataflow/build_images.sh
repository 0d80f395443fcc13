#!/usr/bin/env bash
# Build and push the linstream images: the SDK worker container (CPU), its GPU variant, and the
# Flex Template launcher.  Run from anywhere; the build context is the repository root.
#
# Required environment:
#   REPO     Artifact Registry path, e.g. us-central1-docker.pkg.dev/my-project/linstream
# Optional:
#   TAG      image tag (default: the package version from pyproject.toml)
#   BUILDER  cloudbuild (default; needs PROJECT) or docker (local docker build + push)
#   PROJECT  GCP project id for Cloud Build
# Prints the three image names as shell assignments at the end.
set -euo pipefail

: "${REPO:?set REPO to an Artifact Registry path, e.g. us-central1-docker.pkg.dev/PROJECT/linstream}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n 1)"
TAG="${TAG:-$version}"
BUILDER="${BUILDER:-cloudbuild}"
image="$REPO/linstream-sdk:$TAG"
image_gpu="$REPO/linstream-sdk-gpu:$TAG"
launcher="$REPO/linstream-launcher:$TAG"

cd "$root"
case "$BUILDER" in
  cloudbuild)
    : "${PROJECT:?set PROJECT for Cloud Build (or BUILDER=docker)}"
    gcloud builds submit --project "$PROJECT" --config deploy/dataflow/cloudbuild.yaml \
      --substitutions "_IMAGE=$image,_IMAGE_GPU=$image_gpu,_LAUNCHER_IMAGE=$launcher" .
    ;;
  docker)
    docker build -f deploy/dataflow/Dockerfile -t "$image" .
    docker build -f deploy/dataflow/Dockerfile.gpu -t "$image_gpu" .
    docker build -f deploy/dataflow/flex_template/Dockerfile -t "$launcher" .
    docker push "$image"
    docker push "$image_gpu"
    docker push "$launcher"
    ;;
  *)
    echo "build_images.sh: BUILDER must be cloudbuild or docker, got '$BUILDER'" >&2
    exit 2
    ;;
esac

echo "IMAGE=$image"
echo "IMAGE_GPU=$image_gpu"
echo "LAUNCHER_IMAGE=$launcher"
