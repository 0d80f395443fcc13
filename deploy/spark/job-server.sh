#!/usr/bin/env bash
# Beam's Spark job server, from the jars that deploy/engines/fetch.sh assembles (fetched on first
# use; needs Java 17, Maven and the network once).  With SPARK_MASTER_URL=local[2] (the default)
# Spark runs inside this process with two task threads; spark://host:7077 uses a Spark cluster.
#
#   JOB_PORT=8099 ARTIFACT_PORT=8098 EXPANSION_PORT=8097 deploy/spark/job-server.sh
#
# Optional environment: SPARK_MASTER_URL (local[2]), JOB_HOST (localhost), JAVA_HEAP (2g),
# ARTIFACTS_DIR (/tmp/beam-artifact-staging, Beam's default: where each submitted job's files are
# staged; a job that does not complete, cancelled or killed, leaves its files there),
# JAVA_TMPDIR (the JVM's temporary folder, /tmp by default: Spark's scratch files).
# Further arguments go to Beam's SparkJobServerDriver.  The process is the job server (exec).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib="$("$here/../engines/fetch.sh" --path spark)"

# Spark 3.5 on Java 17: the module openings Spark's own launcher adds (JavaModuleOptions).
opens=()
for pkg in java.lang java.lang.invoke java.lang.reflect java.io java.net java.nio java.util \
  java.util.concurrent java.util.concurrent.atomic sun.nio.ch sun.nio.cs sun.security.action \
  sun.util.calendar; do
  opens+=("--add-opens=java.base/$pkg=ALL-UNNAMED")
done

exec java -Xmx"${JAVA_HEAP:-2g}" ${JAVA_TMPDIR:+"-Djava.io.tmpdir=$JAVA_TMPDIR"} "${opens[@]}" \
  -cp "$lib/*" org.apache.beam.runners.spark.SparkJobServerDriver \
  --spark-master-url="${SPARK_MASTER_URL:-local[2]}" \
  --job-host="${JOB_HOST:-localhost}" \
  --job-port="${JOB_PORT:-8099}" \
  --artifact-port="${ARTIFACT_PORT:-8098}" \
  --expansion-port="${EXPANSION_PORT:-8097}" \
  --artifacts-dir="${ARTIFACTS_DIR:-/tmp/beam-artifact-staging}" \
  "$@"
