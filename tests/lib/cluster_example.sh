#!/usr/bin/env bash
# What every client's install test runs with its installed example worker (from bash, pytest or
# minitest): the leader-kill check of cluster.sh, on a fresh 3-node cluster, with COMMAND as the
# example worker.
#
#   tests/lib/cluster_example.sh BROKER DIR QUEUE PAYLOAD -- COMMAND [ARG...]
#
# COMMAND runs in the current directory with $JOBBROKER_ADDRESS set to the nodes' addresses
# (comma-separated), working QUEUE; PAYLOAD is job N's payload with each {n} replaced by N.
# Exits 0 once all 50 jobs completed (a kill -9 of the queue's leader among them) and the worker
# exited 0 on SIGTERM; otherwise 1, with the worker's output (DIR/worker.log) and the nodes' logs.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
broker="$1" dir="$2" queue="$3" template="$4"
shift 4
[[ "${1:-}" == "--" ]] && shift
# shellcheck source=cluster.sh
source "$here/cluster.sh"

worker_pid=""
finish() {
  [[ -n "$worker_pid" ]] && kill -KILL "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  [[ -n "${cluster_etcd_pid:-}" ]] && cluster_stop
}
trap finish EXIT
fail() {
  echo "cluster_example: $*" >&2
  for f in "$dir"/worker.log "$dir"/cluster/node-*.log; do
    [[ -f "$f" ]] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
  done
  exit 1
}

payload() { printf '%s' "${template//\{n\}/$1}"; }
start_worker() {
  JOBBROKER_ADDRESS="$cluster_addresses" "$@" >"$dir/worker.log" 2>&1 &
  worker_pid=$!
}
# cluster_leader_kill_check calls start_worker without arguments: bind the command here.
command=("$@")
start_example() { start_worker "${command[@]}"; }

mkdir -p "$dir"
cluster_start "$broker" "$dir/cluster" || fail "the cluster did not start"
cluster_leader_kill_check "$queue" payload start_example || fail "the example worker lost jobs"
kill -TERM "$worker_pid"
wait "$worker_pid" || fail "the example worker exited $? on SIGTERM"
worker_pid=""
