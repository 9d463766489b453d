#!/usr/bin/env bash
# Lease+Ack cost behind a backlog, each case on a fresh broker (temp data dir, free port):
#   1,000 ready jobs vs 1,000,000 ready jobs (leasing should stay O(log n)), and 100,000 ready
#   jobs spread over 10,000 concurrency keys. Prints the bench lines and the broker's RSS.
# Environment: BUILD_DIR (default: ../build next to this script), MEASURED (jobs leased and
# acked per case, default 1000), BIG (default 1000000).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
broker="$build_dir/server/jobbroker"
bench="$build_dir/bench/jobbroker-bench"
measured="${MEASURED:-1000}"
big="${BIG:-1000000}"

run_case() {  # run_case PRELOAD KEYS
  local tmp pid address=""
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-backlog.XXXXXX")"
  "$broker" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$tmp/data" \
    >"$tmp/stdout" 2>"$tmp/stderr" &
  pid=$!
  for _ in $(seq 1 300); do
    address="$(sed -n 's/^jobbroker: serving grpc=\([^ ]*\) .*/\1/p' "$tmp/stdout" | head -n 1)"
    [[ -n "$address" ]] && break
    sleep 0.1
  done
  if [[ -z "$address" ]]; then
    echo "backlog.sh: broker did not start" >&2
    cat "$tmp/stderr" >&2
    kill -KILL "$pid" 2>/dev/null || true
    rm -rf "$tmp"
    return 1
  fi
  "$bench" backlog --address "$address" --preload "$1" --keys "$2" --jobs "$measured" \
    --workers 16 --concurrency 8 --batch 1000 | grep -v '^{'
  echo "broker RSS with $1 jobs: $(awk '/VmRSS/ {print $2, $3}' "/proc/$pid/status")"
  kill -TERM "$pid"
  wait "$pid" || true
  rm -rf "$tmp"
}

run_case 1000 0
run_case "$big" 0
run_case 100000 10000
