#!/usr/bin/env bash
# Builds the Java client (stubs generated from ../../proto by protoc at build time) and runs its
# tests against the real broker ($JOBBROKER_BIN, else <repo>/build/server/jobbroker).
# Maven fetches the pinned versions of pom.xml into ~/.m2 on the first run; later runs reuse them.
# Extra arguments go to Maven (e.g. ./test.sh -Dtest=WorkerTest).
set -euo pipefail
cd "$(dirname "$0")"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

status=0
mvn -B -ntp -Dstyle.color=never verify "$@" 2>&1 | tee "$log" || status=$?

# End with Surefire's total (the last "Tests run:" line without a class name).
summary="$(grep -E '^\[[A-Z]+\] Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+$' "$log" | tail -n 1 || true)"
echo
if [[ -n "$summary" ]]; then
  echo "${summary#\[*\] }"
else
  echo "no Surefire summary: the build failed before the tests ran"
  [[ $status -ne 0 ]] || status=1
fi
exit "$status"
