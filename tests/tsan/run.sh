#!/usr/bin/env bash
# The concurrency-heavy C++ tests under ThreadSanitizer: the `tsan` configure, build and test
# presets (CMakePresets.json). Exit status: 0 if every test passed with no TSan report.
#
# The tests: core_broker_test (with the commit pipeline's background mode), the storage tests
# (MemoryStore, RocksDbStore, the conformance suite) and broker_concurrency_test. Not the e2e
# and client tests: gRPC is not instrumented either, and its own threads hand work to each other
# through synchronisation TSan cannot see (libgrpc's completion queues and event engine), so
# both the broker and the test processes report races inside gRPC's inline headers and its
# epoll file descriptors. Suppressing those would hide races in our reactors too.
#
# Before the tests, the canary (race_canary.cc) checks the build itself: with the absl::Mutex shim
# in place, code that synchronises only through Abseil must be clean, and two deliberate races
# must still be reported. Without that, a shim that hid races would make this suite pass for
# the wrong reason.
set -euo pipefail
cd "$(dirname "$0")/../.."

cmake --preset tsan
cmake --build --preset tsan

canary=build/tsan/tests/tsan/tsan_race_canary
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
if ! out=$("$canary" clean 2>&1); then
  printf '%s\n' "$out"
  echo "tsan: the canary's clean mode failed: the shim does not tell TSan about absl::Mutex" >&2
  exit 1
fi
for mode in unguarded wrong-mutex; do
  if out=$("$canary" "$mode" 2>&1) || ! grep -q "WARNING: ThreadSanitizer: data race" <<<"$out"; then
    printf '%s\n' "$out"
    echo "tsan: the canary's $mode race was not reported: TSan cannot fail in this build" >&2
    exit 1
  fi
done
echo "tsan: canary ok (clean mode quiet, both deliberate races reported)"

ctest --preset tsan
