#!/usr/bin/env bash
# Lease+Ack cost behind a backlog, each case on a fresh broker (temp data dir, free port):
#   1,000 ready jobs vs 1,000,000 ready jobs (leasing should stay O(log n)), 100,000 ready jobs
#   spread over 10,000 concurrency keys, and 100,000 spread over 10,000 queues (each worker
#   leasing from them in turn). Prints the bench lines and the broker's RSS (also
#   per job beyond the small case's), and for the big case the time a restart on the same data
#   takes from exec to its "serving" line, and the RSS after it.
# Environment: BUILD_DIR (default: ../build next to this script), MEASURED (jobs leased and
# acked per case, default 1000), BIG (default 1000000).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
broker="$build_dir/server/jobbroker"
bench="$build_dir/bench/jobbroker-bench"
measured="${MEASURED:-1000}"
big="${BIG:-1000000}"

# shellcheck source=lib/serve.sh
source "$here/lib/serve.sh"
# A restart with millions of jobs reads them all before it serves.
export SERVE_TIMEOUT=600

start_broker() {  # start_broker DIR: sets pid and address, or returns 1
  serve_broker "$broker" "$1" || return 1
  pid="$broker_pid"
  address="$broker_address"
  http="$broker_http"
}

rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

small_rss=""
run_case() {  # run_case PRELOAD KEYS QUEUES [restart]
  local tmp pid address="" http=""
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-backlog.XXXXXX")"
  start_broker "$tmp" || { rm -rf "$tmp"; return 1; }
  "$bench" backlog --address "$address" --preload "$1" --keys "$2" --queues "$3" \
    --jobs "$measured" \
    --workers 16 --concurrency 8 --batch 1000 | grep -v '^{'
  local rss n=$(($1 > measured ? $1 : measured))  # the bench preloads at least --jobs
  rss="$(rss_kb "$pid")"
  # What a Prometheus scrape costs with this many queues and keys: one page of every series.
  curl -sS -o /dev/null -w "metrics scrape: %{size_download} bytes in %{time_total} s\n" \
    "http://$http/metrics"
  echo "broker RSS with $n jobs: $rss kB"
  if [[ -z "$small_rss" ]]; then
    small_rss="$rss"
    first="$n"
  else
    echo "  beyond the $first jobs case: $(((rss - small_rss) * 1024 / (n - first))) bytes per job"
  fi
  serve_stop "$pid"
  if [[ "${4:-}" == restart ]]; then
    local t0 t1
    t0="$(date +%s%N)"
    start_broker "$tmp" || { rm -rf "$tmp"; return 1; }
    t1="$(date +%s%N)"
    echo "restart with $1 jobs: $(((t1 - t0) / 1000000)) ms to serving, RSS $(rss_kb "$pid") kB"
    serve_stop "$pid"
  fi
  rm -rf "$tmp"
}

run_case 1000 0 1
run_case "$big" 0 1 restart
run_case 100000 10000 1
run_case 100000 0 10000
