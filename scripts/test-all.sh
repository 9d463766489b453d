#!/usr/bin/env bash
# Runs every test suite against the built broker: C++ (ctest, then again under ASan+UBSan, the
# concurrency tests under TSan), the crash-consistency harness, the fuzzers, the
# API checks, the Helm chart's checks (lint, offline Kubernetes schemas, the rendered config
# through --check-config), the Dockerfile's lint, each client language's own test.sh (which
# installs its packages from its lock file, builds the package and runs its tests against a
# real jobbroker), and last the container image built and run with podman. Every suite runs
# even after one fails; the summary names each with its result and time.
#
#   scripts/test-all.sh                  # all suites
#   scripts/test-all.sh python go        # some of them
#   scripts/test-all.sh python+go        # two of them at the same time
#
# Each suite may run for SUITE_TIMEOUT seconds (default 1800); one that hangs is stopped and
# FAILED, and the rest still run, so a hang shows in the summary instead of using up CI's time.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
build="${BUILD:-build}"
jobs="${JOBS:-2}"
# The C++ tests spend most of their time waiting on the processes, sockets and disks they start,
# not computing: on 2 cores, 6 at a time took the release run from 173 s to 68-98 s, with about
# 1.2-1.9 cores busy (the ASan run's own count, 4, is in CMakePresets.json: it computes more).
test_jobs="${TEST_JOBS:-6}"
export JOBBROKER_BIN="$root/$build/server/jobbroker"
suite_timeout="${SUITE_TIMEOUT:-1800}"

# interop runs after every client's suite: it uses what they built (venvs, node_modules,
# target/ folders). "a+b" runs suites a and b at the same time: each client suite mostly waits on
# the brokers it starts and on its package tools, so two at once take about the time of the
# longer (each has its own temp dirs and free ports); their output is shown when both are done.
all_suites=(cpp asan tsan crash jepsen fuzz api chart image-lint ui python+go
  typescript+rust java+ruby interop bench image)
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=("${all_suites[@]}")

run_suite() {
  case "$1" in
    # Every C++ test, then the C++ client as users get it: installed into an empty prefix and
    # built from a scratch CMake project (client/cpp/test.sh).
    cpp) ctest --test-dir "$build" -j"$test_jobs" --output-on-failure && client/cpp/test.sh ;;
    # Every C++ test again, built by clang with AddressSanitizer and UBSan (CMakePresets.json:
    # asan); the e2e tests then run the sanitized broker, so a leak or an error in it fails them
    # too. The same build checks every lock annotation: clang's -Wthread-safety -Werror makes a
    # member marked ABSL_GUARDED_BY read or written without its mutex, or a ...Locked method
    # called without it, a compile error, in every target.
    asan) cmake --preset asan >/dev/null && cmake --build --preset asan && ctest --preset asan ;;
    # The concurrency-heavy tests under ThreadSanitizer (tests/tsan/README.md).
    tsan) tests/tsan/run.sh ;;
    # The broker killed with SIGKILL 20 times under producers and workers; the checker proves
    # nothing acknowledged was lost (tests/crash/README.md). Once with the default durability
    # (SYNC), once with DURABILITY_GROUP queues, which must survive a killed process too, and
    # every waiting job cold (--max-hot-jobs 0), so each lease reads its job back from RocksDB,
    # on 4 partitions (the two queues in two of them: each worker's stream spans both). The two
    # runs go side by side (each broker on its own port and directory): each spends most of its
    # time in its fixed kill phase and settle, so together they take about the time of one.
    crash) run_side_by_side \
      "BUILD=$build tests/crash/run.sh --kills 20" \
      "BUILD=$build tests/crash/run.sh --kills 20 --durability group --max-hot-jobs 0 --partitions 4" ;;
    # Cluster mode under faults: etcd (3 members), 3 nodes, Toxiproxy on every link; 12
    # nemeses, every kind of CLUSTER.md at least once, under the crash harness's producers and
    # workers; the checker proves nothing acknowledged was lost or undone, one writer per epoch
    # (tests/cluster/jepsen/README.md). The 100-nemesis run is bench/cluster-jepsen.sh.
    jepsen) BUILD="$build" tests/cluster/jepsen/run.sh --nemeses 12 ;;
    # The libFuzzer targets, 60 s each, from the committed corpus (tests/fuzz/README.md).
    fuzz) tests/fuzz/run.sh ;;
    api) scripts/api-check.sh ;;
    interop) tests/interop/test.sh --all-pairs ;;
    # The side-by-side comparison with BullMQ/Redis and beanstalkd, small (--quick): installs
    # the peers and proves the one command still runs end to end; then the DAG (1 -> 1,000 -> 1)
    # against BullMQ's flows, once each. Speed is not judged here
    # (docs/performance.md has the full runs); a run that fails or times out fails the suite.
    bench) BUILD_DIR="$root/$build" bench/peers/run.sh --quick &&
      BUILD_DIR="$root/$build" bench/peers/dag.sh --quick ;;
    chart) tests/chart/test.sh ;;
    # The dashboard in headless Chromium against the real broker (tests/ui/README.md).
    ui) tests/ui/test.sh ;;
    image-lint) tests/image/lint.sh ;;
    image) scripts/image-check.sh ;;
    *)
      [ -x "client/$1/test.sh" ] || { echo "no suite named '$1'"; return 1; }
      "client/$1/test.sh"
      ;;
  esac
}

# Runs each command line given at the same time; prints their outputs one after the other once
# all have ended; fails if any failed.
run_side_by_side() {
  local out rc=0 i
  out="$(mktemp -d /tmp/jobbroker-side-by-side.XXXXXX)"
  local commands=("$@") pids=()
  for i in "${!commands[@]}"; do
    bash -c "${commands[$i]}" >"$out/$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!commands[@]}"; do
    wait "${pids[$i]}" || rc=1
    echo ">>> ${commands[$i]}"
    cat "$out/$i.log"
  done
  rm -rf "$out"
  return "$rc"
}

# run_suite runs in a child bash under timeout(1), which needs the function and what it reads.
export -f run_suite run_side_by_side
export root build jobs test_jobs

# Each suite's output goes to the terminal and to a log; the summary ends with the lines of each
# failed suite that say why, because a CI page often shows only the last screen of a run.
logs="$(mktemp -d /tmp/jobbroker-suites.XXXXXX)"
passed_list=()
failed_list=()
# Records the result of `suite` (exit status $2, $3 seconds) for the summary.
account() {
  local suite="$1" rc="$2" took="$3" result
  if [ "$rc" -eq 0 ]; then
    passed_list+=("$suite ${took}s")
  else
    result=FAILED
    [ "$rc" -eq 124 ] && result=TIMEOUT && echo "=== $suite: stopped after ${suite_timeout} s ==="
    failed_list+=("$suite")
    printf '%s %s after %ss\n' "$result" "$suite" "$took" >"$logs/$suite.why"
    # The lines that name a failure, else the suite's last lines.
    # and the first lines of each "--- " block (a conformance cell's problem, a log's tail).
    { grep -a -E 'FAIL|Failed|Error|ERROR|error:|mismatch|disagree|Assert|assert|Traceback|TIMEOUT|timed out|lost [1-9]' \
        "$logs/$suite.log" | grep -a -v -E ' pass(ed)? ' | tail -n 12 || true
      grep -a -A3 '^--- ' "$logs/$suite.log" | head -n 12 || true; } | cut -c1-300 |
      sed 's/^/    /' >>"$logs/$suite.why"
    [ "$(wc -l <"$logs/$suite.why")" -gt 1 ] || tail -n 12 "$logs/$suite.log" | sed 's/^/    /' >>"$logs/$suite.why"
  fi
}

run_timed() {  # run_timed SUITE: runs it under the suite timeout; its exit status
  timeout --kill-after=60 "$suite_timeout" bash -c 'run_suite "$1"' _ "$1"
}

for entry in "${suites[@]}"; do
  if [[ "$entry" != *+* ]]; then
    echo
    echo "=== $entry ==="
    start=$SECONDS
    run_timed "$entry" 2>&1 | tee "$logs/$entry.log"
    account "$entry" "${PIPESTATUS[0]}" $((SECONDS - start))
    continue
  fi
  IFS=+ read -ra group <<<"$entry"
  echo
  echo "=== ${group[*]} (at the same time) ==="
  pids=()
  for suite in "${group[@]}"; do
    (
      start=$SECONDS
      run_timed "$suite" >"$logs/$suite.log" 2>&1
      echo "$? $((SECONDS - start))" >"$logs/$suite.rc"
    ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  for suite in "${group[@]}"; do
    echo
    echo "=== $suite ==="
    cat "$logs/$suite.log"
    read -r rc took <"$logs/$suite.rc"
    account "$suite" "$rc" "$took"
  done
done

echo
echo "=== summary ==="
echo "passed (${#passed_list[@]}):"
printf '%s\n' "${passed_list[@]}" | paste -sd ',' | sed 's/,/, /g' | fold -s -w 100 | sed 's/^/  /'
for suite in "${failed_list[@]}"; do cat "$logs/$suite.why"; done
echo "suites: ${#passed_list[@]} passed, ${#failed_list[@]} failed (logs: $logs)"
[ "${#failed_list[@]}" -eq 0 ]
