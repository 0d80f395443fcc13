#!/usr/bin/env bash
# Fetch the engines linstream is tested on into a cache folder outside the clone, with `mvn` for
# jars (Maven Central) and `go install` for Prism (the Go module proxy), and nothing else:
#
#   flink   Beam's Flink job server (Beam 2.70.0, Flink 1.19, embedded local cluster) with the
#           cross-language Kafka I/O of its built-in expansion service      deploy/engines/flink/pom.xml
#   spark   Beam's Spark job server (Beam 2.70.0, Spark 3.5.1)             deploy/engines/spark/pom.xml
#   kafka   a Kafka 4.1.1 broker (the streaming tests start it)             deploy/engines/kafka/pom.xml
#   prism   Beam's Prism runner v2.78.0 (the Python SDK's version), built by `go install`
#
# usage: deploy/engines/fetch.sh [PIECE...]          fetch these (default: all), report each
#        deploy/engines/fetch.sh --path PIECE        fetch it if needed; print its path (a jar
#                                                    folder, or the prism binary) and nothing else
#
# Cache: $LINSTREAM_ENGINES_CACHE (default ~/.cache/linstream/engines).  Each piece goes to a
# folder named by its version (a jar piece: by its pom's SHA-256), marked ready only once
# complete, so a second call costs nothing and an interrupted one starts over.  Calls that
# overlap wait for each other (flock).  Each fetch is bounded by $LINSTREAM_FETCH_TIMEOUT
# seconds (default 900).  Maven's downloads stay in the cache's m2/ folder; Go's in Go's own
# module and build caches.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${LINSTREAM_ENGINES_CACHE:-$HOME/.cache/linstream/engines}"
TIMEOUT="${LINSTREAM_FETCH_TIMEOUT:-900}"
PRISM_VERSION="v2.78.0"
PRISM_MODULE="github.com/apache/beam/sdks/v2/go/cmd/prism"
DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
PIECES=(flink spark kafka prism)

say() { echo "fetch.sh: $*" >&2; }
die() { say "$*"; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is not installed (needed for $2)"
}

# The folder a piece is (to be) fetched into.
target() {
  case "$1" in
    prism) echo "$CACHE/prism-$PRISM_VERSION" ;;
    flink|spark|kafka)
      local sum
      sum="$(sha256sum "$here/$1/pom.xml" | cut -c1-12)"
      echo "$CACHE/$1-$sum"
      ;;
    *) die "unknown piece '$1' (expected one of: ${PIECES[*]})" ;;
  esac
}

# What a user of the piece points at: the jar folder, or the prism binary.
product() {
  case "$1" in
    prism) echo "$(target prism)/prism" ;;
    *) echo "$(target "$1")/lib" ;;
  esac
}

fetch_jars() {  # piece dir
  need mvn "the $1 jars"
  need java "the $1 jars"
  local tmp="$2.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp" "$CACHE/m2"
  timeout "$TIMEOUT" mvn -B -q -f "$here/$1/pom.xml" -Dmaven.repo.local="$CACHE/m2" \
    "$DEPENDENCY_PLUGIN:copy-dependencies" -DincludeScope=runtime \
    -DoutputDirectory="$tmp/lib" >"$tmp/mvn.log" 2>&1 ||
    die "mvn could not assemble $1 (exit $?); see $tmp/mvn.log"
  cp "$here/$1/pom.xml" "$tmp/pom.xml"
  rm -rf "$2"
  mv "$tmp" "$2"
}

fetch_prism() {  # dir
  need go "Prism"
  local tmp="$1.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  GOBIN="$tmp" GOFLAGS=-mod=mod timeout "$TIMEOUT" \
    go install "$PRISM_MODULE@$PRISM_VERSION" >"$tmp/go.log" 2>&1 ||
    die "go install could not build Prism $PRISM_VERSION (exit $?); see $tmp/go.log"
  rm -rf "$1"
  mv "$tmp" "$1"
}

# Fetch one piece unless it is ready; prints nothing on stdout.
ensure() {
  local piece="$1" dir
  dir="$(target "$piece")"
  mkdir -p "$CACHE"
  (
    flock 9
    if [ -e "$dir/ready" ]; then
      exit 0
    fi
    local t0=$SECONDS
    say "$piece: fetching into $dir"
    case "$piece" in
      prism) fetch_prism "$dir" ;;
      *) fetch_jars "$piece" "$dir" ;;
    esac
    date -u +%FT%TZ >"$dir/ready"
    say "$piece: ready in $((SECONDS - t0)) s"
  ) 9>"$CACHE/$piece.lock"
}

if [ "${1:-}" = "--path" ]; then
  [ $# -eq 2 ] || die "usage: fetch.sh --path PIECE"
  target "$2" >/dev/null
  ensure "$2"
  product "$2"
  exit 0
fi

pieces=("$@")
[ ${#pieces[@]} -gt 0 ] || pieces=("${PIECES[@]}")
for piece in "${pieces[@]}"; do
  target "$piece" >/dev/null
done
status=0
for piece in "${pieces[@]}"; do
  # A process of its own per piece: a failed piece does not stop the others, and `set -e` holds
  # inside it (bash ignores it in functions called from a condition).
  if path="$("${BASH_SOURCE[0]}" --path "$piece")"; then
    say "$piece: $path"
  else
    status=1
  fi
done
exit "$status"
