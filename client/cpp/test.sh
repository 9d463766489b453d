#!/usr/bin/env bash
# The install test of the C++ client: `cmake --install` of the jobbroker_client component of the
# release tree (build/, already built: scripts/test-all.sh runs this after ctest) into an empty
# prefix, a scratch CMake project outside the repository that finds it with
# find_package(jobbroker_client CONFIG REQUIRED) and builds examples/worker.cc against
# jobbroker::client, and that worker run against the real broker with TLS and a token: a job
# enqueued by the installed jobbroker-cli completes. $JOBBROKER_BUILD_DIR (default <repo>/build)
# and $JOBBROKER_BIN (default its server/jobbroker) override the paths.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${JOBBROKER_BUILD_DIR:-$repo/build}"
broker="${JOBBROKER_BIN:-$build/server/jobbroker}"
version="$(tr -d '[:space:]' <"$repo/VERSION")"
for tool in cmake ninja openssl; do
  command -v "$tool" >/dev/null || { echo "client/cpp/test.sh: $tool not found" >&2; exit 1; }
done
[[ -x "$broker" ]] || { echo "client/cpp/test.sh: no broker at $broker (build it first)" >&2; exit 1; }

# Only what this script passes: no address or token from the caller's environment.
unset JOBBROKER_ADDRESS JOBBROKER_TOKEN JOBBROKER_CA
tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-cpp-install.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "client/cpp/test.sh: FAIL: $*" >&2
  for log in "$tmp"/*.log "$tmp"/broker/broker.log; do
    [[ -f "$log" && "$log" != */openssl.log ]] && { echo "--- $log" >&2; tail -20 "$log" >&2; }
  done
  exit 1
}

echo "== installing the jobbroker_client component of $build"
# Up to date after the suite's build; rebuilds only the client's targets if not.
cmake --build "$build" --target jobbroker_client jobbroker-cli -j2 >"$tmp/build.log" 2>&1 ||
  fail "building the client targets"
prefix="$tmp/prefix"
cmake --install "$build" --component jobbroker_client --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  fail "cmake --install"
for f in include/jobbroker/client.h include/jobbroker/worker.h include/jobbroker/version.h \
  include/jobbroker/v1/broker.grpc.pb.h lib/libjobbroker_client.a lib/libjobbroker_proto.a \
  bin/jobbroker-cli lib/cmake/jobbroker_client/jobbroker_clientConfig.cmake \
  lib/cmake/jobbroker_client/jobbroker_clientConfigVersion.cmake \
  share/doc/jobbroker_client/LICENSE; do
  [[ -e "$prefix/$f" ]] || fail "not installed: $f"
done
cmp -s "$repo/LICENSE" "$prefix/share/doc/jobbroker_client/LICENSE" || fail "LICENSE differs"
[[ ! -e "$prefix/bin/jobbroker" ]] || fail "the broker is not part of the client component"
grep -q "#define JOBBROKER_CLIENT_VERSION \"$version\"" "$prefix/include/jobbroker/version.h" ||
  fail "version.h does not carry VERSION ($version)"
grep -q "PACKAGE_VERSION \"$version\"" \
  "$prefix/lib/cmake/jobbroker_client/jobbroker_clientConfigVersion.cmake" ||
  fail "the package version is not VERSION ($version)"
echo "installed $(cd "$prefix" && find . -type f | wc -l) files, version $version"

echo "== a scratch project: find_package(jobbroker_client), examples/producer.cc and worker.cc"
app="$tmp/app"
mkdir -p "$app"
cp "$here/examples/producer.cc" "$here/examples/worker.cc" "$app/"
cat >"$app/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(install_test CXX)
find_package(jobbroker_client $version EXACT CONFIG REQUIRED)
add_compile_options(-Wall -Wextra -Werror -Wno-missing-field-initializers)
add_executable(producer producer.cc)
target_link_libraries(producer PRIVATE jobbroker::client)
add_executable(worker worker.cc)
target_link_libraries(worker PRIVATE jobbroker::client)
CMAKE
# Only the fresh prefix: no package registry, nothing of the repository.
cmake -S "$app" -B "$app/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$tmp/app-configure.log" 2>&1 || fail "configuring the scratch project"
found="$(sed -n 's/^jobbroker_client_DIR:PATH=//p' "$app/build/CMakeCache.txt")"
[[ "$found" == "$prefix/lib/cmake/jobbroker_client" ]] || fail "found the package at $found"
grep -qF "$repo" "$app/build/compile_commands.json" "$app/build/build.ninja" &&
  fail "the scratch build refers to the repository"
cmake --build "$app/build" -j2 >"$tmp/app-build.log" 2>&1 || fail "building the scratch project"
echo "built producer and worker in $app/build against $found"

echo "== the worker over TLS with a token"
# shellcheck source=../../tests/lib/secured_broker.sh
source "$repo/tests/lib/secured_broker.sh"
secured_broker_start "$broker" "$tmp/broker" || fail "the secured broker did not start"
pids+=("$secured_pid")
address="$secured_address" token="$secured_token" certs="$tmp/broker/pki"
printf '%s\n' "$token" >"$tmp/token"

cli=("$prefix/bin/jobbroker-cli" --address "$address" --tls-ca "$certs/ca.pem")
queue="cpp-install-$RANDOM"
# The token is needed: without it the broker refuses the call.
"${cli[@]}" queues >/dev/null 2>&1 && fail "a call without the token succeeded"

JOBBROKER_ADDRESS="$address" JOBBROKER_TOKEN="$token" JOBBROKER_CA="$certs/ca.pem" \
  "$app/build/worker" "$queue" >"$tmp/worker.log" 2>&1 &
worker=$!
pids+=("$worker")
"${cli[@]}" --token-file "$tmp/token" enqueue "$queue" installed@example.com --wait \
  --wait-timeout 60s >"$tmp/enqueue.log" 2>&1 || fail "the job did not complete"
id="$(head -1 "$tmp/enqueue.log")"
"${cli[@]}" --token-file "$tmp/token" --json get "$id" >"$tmp/job.log" 2>&1 || fail "get $id"
# proto3 JSON: the result bytes in base64 ("sent").
grep -q '"state": *"JOB_STATE_COMPLETED"' "$tmp/job.log" || fail "the job is not COMPLETED"
grep -q "\"result\": *\"$(printf sent | base64)\"" "$tmp/job.log" || fail "the job's result is not the worker's"
"${cli[@]}" --token-file "$tmp/token" --json workers "$queue" >"$tmp/workers.log" 2>&1 || fail "workers"
grep -qF "jobbroker-cpp/$version" "$tmp/workers.log" || fail "ListWorkers does not show jobbroker-cpp/$version"
# And the example producer's job.
id2="$(JOBBROKER_ADDRESS="$address" JOBBROKER_TOKEN="$token" JOBBROKER_CA="$certs/ca.pem" \
  "$app/build/producer" "$queue" producer@example.com 2>"$tmp/producer.log")" || fail "the producer"
timeout 60 "${cli[@]}" --token-file "$tmp/token" watch "$id2" >"$tmp/watch.log" 2>&1 ||
  fail "the producer's job did not complete"
kill -TERM "$worker"
wait "$worker" || fail "the worker exited $?"
grep -q "^sent $id to installed@example.com" "$tmp/worker.log" || fail "the worker did not log the job"
grep -q "^sent $id2 to producer@example.com" "$tmp/worker.log" || fail "the worker did not log the job"
echo "jobs $id (jobbroker-cli) and $id2 (examples/producer.cc) completed by the installed package's worker (jobbroker-cpp/$version, TLS, token)"
kill "$secured_pid" && wait "$secured_pid" 2>/dev/null

echo "== a 3-node cluster: the installed worker through a kill -9 of its queue's leader"
queue="cpp-cluster-$RANDOM"
"$repo/tests/lib/cluster_example.sh" "$broker" "$tmp/cluster" "$queue" 'c{n}@example.com' -- \
  "$app/build/worker" "$queue" || fail "the installed worker lost jobs in the cluster"
echo "client/cpp/test.sh: OK"
