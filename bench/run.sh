#!/usr/bin/env bash
# Runs the standard benchmark set against a freshly started broker:
#   enqueue with concurrency 1 (each Enqueue waits for its own fsync) and 64 (group commit),
#   e2e with 16 workers (preload, then Lease+Ack), e2e-mixed (producers and workers at once),
#   stream with 1, 4 and 16 streaming workers (enqueue -> push -> ack), and latency (enqueue
#   return -> arrival at an idle streaming worker, at 1,000 enqueues/s).
# The broker gets a temp data dir and free ports (read from its "serving" line), and is stopped
# with SIGTERM at the end; a non-zero exit status from it fails the script.
#
# Environment: BUILD_DIR (default: ../build next to this script), JOBS (20000),
# SERIAL_JOBS (3000, for concurrency 1), PAYLOAD_BYTES (100), RESULTS (a file to append the JSON
# lines to; default: none), TMPDIR (where the data dir goes: put it on the disk you measure).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
broker="$build_dir/server/jobbroker"
bench="$build_dir/bench/jobbroker-bench"
jobs="${JOBS:-20000}"
serial_jobs="${SERIAL_JOBS:-3000}"
payload="${PAYLOAD_BYTES:-100}"

for f in "$broker" "$bench"; do
  if [[ ! -x "$f" ]]; then
    echo "run.sh: $f not built (cmake --build $build_dir --target jobbroker jobbroker-bench)" >&2
    exit 2
  fi
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-bench.XXXXXX")"
broker_pid=""
# shellcheck source=lib/serve.sh
source "$here/lib/serve.sh"
cleanup() {
  if [[ -n "$broker_pid" ]]; then serve_stop "$broker_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

serve_broker "$broker" "$tmp" || exit 1
address="$broker_address"
echo "broker pid $broker_pid serving at $address, data in $tmp/data" >&2

out="$tmp/results.jsonl"
run() {
  echo "+ jobbroker-bench $*" >&2
  "$bench" --address "$address" --payload-bytes "$payload" "$@" | tee -a "$tmp/bench.out"
}
status=0
run enqueue --concurrency 1 --jobs "$serial_jobs" || status=1
run enqueue --concurrency 64 --jobs "$jobs" || status=1
run e2e --workers 16 --concurrency 16 --jobs "$jobs" || status=1
run e2e-mixed --workers 16 --concurrency 16 --jobs "$jobs" || status=1
for w in 1 4 16; do
  run stream --workers "$w" --concurrency 64 --jobs "$jobs" || status=1
done
run latency --rate 1000 --jobs "$serial_jobs" || status=1
grep '^{' "$tmp/bench.out" >"$out" || true
if [[ -n "${RESULTS:-}" ]]; then
  cat "$out" >>"$RESULTS"
fi

stop_broker "$tmp" || status=1
exit "$status"
