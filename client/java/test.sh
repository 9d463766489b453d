#!/usr/bin/env bash
# Builds the Java client (stubs generated from ../../proto by protoc at build time) into
# target/jobbroker-client-VERSION.jar (+ -sources.jar, -javadoc.jar, .pom), runs its tests against
# the real broker ($JOBBROKER_BIN, else <repo>/build/server/jobbroker), then the install test
# (scripts/install-test.sh: the built jar installed into a temporary repository, the examples built
# from it and run over TLS with a token), then the Spring Boot module (spring-boot/test.sh: built and
# tested against that jar, installed into target/spring-boot-m2, never into ~/.m2).
# VERSION is the repository's VERSION file, passed to Maven as -Drevision.
# Maven fetches the pinned versions of pom.xml into ~/.m2 on the first run; later runs reuse them.
# Extra arguments go to Maven (e.g. ./test.sh -Dtest=WorkerTest) and skip the install test and the
# Spring Boot module.
set -euo pipefail
cd "$(dirname "$0")"

version="$(tr -d '[:space:]' <../../VERSION)"
pom_default="$(sed -n 's:^ *<revision>\(.*\)</revision>.*:\1:p' pom.xml | head -1)"
if [[ "$pom_default" != "$version" ]]; then
  echo "pom.xml's default <revision> is '$pom_default', ../../VERSION is '$version': make them equal" >&2
  exit 1
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

status=0
mvn -B -ntp -Dstyle.color=never -Drevision="$version" verify "$@" 2>&1 | tee "$log" || status=$?

# Surefire's total (the last "Tests run:" line without a class name).
summary="$(grep -E '^\[[A-Z]+\] Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+$' "$log" | tail -n 1 || true)"

install="install test: not run (the build failed)"
if [[ $status -eq 0 && $# -gt 0 ]]; then
  install="install test: skipped (extra Maven arguments)"
elif [[ $status -eq 0 ]]; then
  if scripts/install-test.sh; then
    install="install test: OK"
  else
    install="install test: FAILED"
    status=1
  fi
fi

spring="spring-boot module: not run (the build or the install test failed)"
if [[ $status -eq 0 && $# -gt 0 ]]; then
  spring="spring-boot module: skipped (extra Maven arguments)"
elif [[ $status -eq 0 ]]; then
  spring_log="$(mktemp)"
  trap 'rm -f "$log" "$spring_log"' EXIT
  if spring-boot/test.sh 2>&1 | tee "$spring_log"; then
    spring_summary="$(grep -E '^\[[A-Z]+\] Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+$' "$spring_log" | tail -n 1 || true)"
    spring="spring-boot module: OK (${spring_summary#\[*\] })"
  else
    spring="spring-boot module: FAILED"
    status=1
  fi
fi

echo
if [[ -n "$summary" ]]; then
  echo "${summary#\[*\] }"
else
  echo "no Surefire summary: the build failed before the tests ran"
  [[ $status -ne 0 ]] || status=1
fi
echo "$install"
echo "$spring"
exit "$status"
