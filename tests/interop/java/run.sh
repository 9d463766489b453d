#!/usr/bin/env bash
# Starts the Java conformance worker (built by build.sh) with the harness's arguments; exec, so
# that the harness's PID is the JVM's own.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
client="$here/../../../client/java"
exec java -cp "$here/.build/classes:$client/target/classes:$(cat "$here/.build/classpath.txt")" \
  ConformanceWorker "$@"
