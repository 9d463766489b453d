#!/usr/bin/env bash
# Compiles ConformanceWorker.java against the Java client's classes (client/java/target/classes,
# made by client/java/test.sh) and its dependency jars into .build/. Idempotent and quiet.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
client="$here/../../../client/java"
out="$here/.build"
mkdir -p "$out"

if [[ ! -d "$client/target/classes/dev/jobbroker/client" ]]; then
  (cd "$client" && mvn -B -q -ntp -o compile >/dev/null)
fi
# The dependency jars in ~/.m2; offline first, Maven Central only when the plugin is missing.
if [[ ! -s "$out/classpath.txt" || "$client/pom.xml" -nt "$out/classpath.txt" ]]; then
  (cd "$client" &&
    { mvn -B -q -ntp -o dependency:build-classpath -DincludeScope=runtime \
        -Dmdep.outputFile="$out/classpath.txt" >/dev/null 2>&1 ||
      mvn -B -q -ntp dependency:build-classpath -DincludeScope=runtime \
        -Dmdep.outputFile="$out/classpath.txt" >/dev/null; })
fi
javac -nowarn -d "$out/classes" \
  -cp "$client/target/classes:$(cat "$out/classpath.txt")" \
  "$here/ConformanceWorker.java"
