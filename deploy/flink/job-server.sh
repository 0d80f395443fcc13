#!/usr/bin/env bash
# Beam's Flink job server with an embedded local Flink cluster, from the jars that
# deploy/engines/fetch.sh assembles (fetched on first use; needs Java 17, Maven and the network
# once).  Its built-in expansion service also serves Beam's cross-language Kafka I/O, whose Java
# harness then runs inside the Flink task managers (pass --default_environment_type=EMBEDDED from
# Python): no Docker anywhere.
#
#   JOB_PORT=8099 ARTIFACT_PORT=8098 EXPANSION_PORT=8097 deploy/flink/job-server.sh
#
# Optional environment: FLINK_MASTER ([local]: a cluster inside this process; host:port: a
# running Flink's REST endpoint), JOB_HOST (localhost), JAVA_HEAP (2g), LOG_LEVEL (warn),
# ARTIFACTS_DIR (/tmp/beam-artifact-staging, Beam's default: where each submitted job's files are
# staged; a job that does not complete, cancelled or killed, leaves its files there),
# JAVA_TMPDIR (the JVM's temporary folder, /tmp by default: Flink unpacks a 22 MB RPC jar
# there at every start and leaves it when the process is killed).
# Further arguments go to Beam's FlinkJobServerDriver.  The process is the job server (exec).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib="$("$here/../engines/fetch.sh" --path flink)"

# Flink 1.19 and Beam read JDK internals through reflection: Java 17 must open them.
opens=()
for pkg in java.lang java.lang.reflect java.io java.net java.nio java.text java.time java.util \
  java.util.concurrent java.util.concurrent.atomic java.util.concurrent.locks sun.nio.ch; do
  opens+=("--add-opens=java.base/$pkg=ALL-UNNAMED")
done

exec java -Xmx"${JAVA_HEAP:-2g}" ${JAVA_TMPDIR:+"-Djava.io.tmpdir=$JAVA_TMPDIR"} "${opens[@]}" \
  -Dorg.slf4j.simpleLogger.defaultLogLevel="${LOG_LEVEL:-warn}" \
  -cp "$lib/*" org.apache.beam.runners.flink.FlinkJobServerDriver \
  --flink-master="${FLINK_MASTER:-[local]}" \
  --job-host="${JOB_HOST:-localhost}" \
  --job-port="${JOB_PORT:-8099}" \
  --artifact-port="${ARTIFACT_PORT:-8098}" \
  --expansion-port="${EXPANSION_PORT:-8097}" \
  --artifacts-dir="${ARTIFACTS_DIR:-/tmp/beam-artifact-staging}" \
  "$@"
