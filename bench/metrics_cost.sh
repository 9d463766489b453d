#!/usr/bin/env bash
# What metrics cost on the hot path: the same streaming end-to-end run (enqueue -> push -> ack,
# 16 streaming workers, no-op handler) against a broker with --metrics on and one with
# --metrics off, alternating, each on a fresh data dir and free ports. Prints each run and the
# median ratio.
# Environment: BUILD_DIR (default ../build), JOBS (20000), ROUNDS (3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
broker="$build_dir/server/jobbroker"
bench="$build_dir/bench/jobbroker-bench"
jobs="${JOBS:-20000}"
rounds="${ROUNDS:-3}"

# shellcheck source=lib/serve.sh
source "$here/lib/serve.sh"

run_one() {  # run_one on|off -> prints jobs/s (runs in a subshell, which starts and stops its broker)
  local tmp
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-metrics.XXXXXX")"
  serve_broker "$broker" "$tmp" --metrics "$1" || exit 1
  "$bench" stream --address "$broker_address" --workers 16 --concurrency 64 --jobs "$jobs" \
    | sed -n 's/.*jobs_per_sec=\([0-9.]*\).*/\1/p' | head -n 1
  serve_stop "$broker_pid"
  rm -rf "$tmp"
}

on=()
off=()
for _ in $(seq 1 "$rounds"); do
  on+=("$(run_one on)")
  off+=("$(run_one off)")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m_on="$(median "${on[@]}")"
m_off="$(median "${off[@]}")"
echo "metrics on : ${on[*]} jobs/s (median $m_on)"
echo "metrics off: ${off[*]} jobs/s (median $m_off)"
awk -v a="$m_on" -v b="$m_off" 'BEGIN { printf "on/off = %.3f (%.1f%% cost)\n", a / b, (1 - a / b) * 100 }'
