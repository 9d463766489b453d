#!/usr/bin/env bash
# scripts/cluster.sh (`make cluster`) as a new user runs it: the three-node cluster comes up with
# every partition led, takes a job, survives kill -9 of a node (its partitions move, the job is
# still there), takes the node back, and SIGTERM (Ctrl-C) stops every process it started. Run by ctest
# (tests/cluster/CMakeLists.txt) with BUILD naming the build dir.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD:?BUILD names the build dir}"
cli="$build/client/cpp/jobbroker-cli"
dir="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-local-cluster-XXXXXX")"
# Ports of its own, away from the defaults and from each other's runs.
base=$((20000 + RANDOM % 20000))
export DIR="$dir" BUILD="$build" ETCD_PORT=$base GRPC_PORT=$((base + 10)) HTTP_PORT=$((base + 20))
all="127.0.0.1:$GRPC_PORT,127.0.0.1:$((GRPC_PORT + 1)),127.0.0.1:$((GRPC_PORT + 2))"
script_pid=""
restarted_pid=""

# The pids of processes whose command line names the run's dir (procps may not be installed).
pids_under_dir() {
  local f pid
  for f in /proc/[0-9]*/cmdline; do
    pid="${f#/proc/}"
    pid="${pid%/cmdline}"
    [[ "$pid" == "$$" ]] && continue
    if tr '\0' ' ' <"$f" 2>/dev/null | grep -qF "$dir/"; then echo "$pid"; fi
  done
}

fail() {
  echo "FAIL: $*" >&2
  echo "--- cluster.sh output ---" >&2
  cat "$dir/out.log" >&2 || true
  exit 1
}
cleanup() {
  [[ -n "$restarted_pid" ]] && kill -9 "$restarted_pid" 2>/dev/null || true
  [[ -n "$script_pid" ]] && kill -TERM "$script_pid" 2>/dev/null || true
  sleep 0.5
  for pid in $(pids_under_dir); do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# `until_ok SECONDS COMMAND...`: runs the command every 0.2 s until it succeeds.
until_ok() {
  local seconds="$1"
  shift
  for _ in $(seq $((seconds * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  return 1
}
# The partition table's rows: "<partition> <leader> <epoch> <replicas> <in sync>".
rows() { "$cli" --address "$all" cluster 2>/dev/null | awk '/^PARTITION/ {t = 1; next} t && NF'; }
led_without() {  # every partition led, none by $1
  local r
  r="$(rows)" && [[ -n "$r" ]] && ! awk '{print $2}' <<<"$r" | grep -qx -e - -e "$1"
}
all_in_sync() {  # every partition's in-sync set holds all three nodes
  local r
  r="$(rows)" && [[ -n "$r" ]] && ! awk '{print $5}' <<<"$r" | grep -qvE '^([^,]+,){2}[^,]+$'
}

"$root/scripts/cluster.sh" >"$dir/out.log" 2>&1 &
script_pid=$!
until_ok 90 grep -q "cluster ready" "$dir/out.log" || fail "no 'cluster ready' within 90 s"
echo "ok: cluster ready"

id="$("$cli" --address "$all" enqueue emails '{"to":"ada@example.com"}')" ||
  fail "enqueue failed right after 'cluster ready'"
echo "ok: enqueued $id"

node0="$(sed -n 's/.*kill -9 \([0-9]*\) *(node-0.*/\1/p' "$dir/out.log")"
[[ -n "$node0" ]] || fail "cluster.sh did not print node-0's pid"
kill -9 "$node0"
until_ok 60 led_without node-0 || fail "node-0's partitions were not led elsewhere within 60 s: $(rows)"
echo "ok: kill -9 of node-0; every partition led by node-1 or node-2"
job_ready() { "$cli" --address "$all" get "$id" | grep -qw READY; }
until_ok 30 job_ready || fail "the job $id is not there, ready: $("$cli" --address "$all" get "$id" 2>&1)"
echo "ok: the job is still there"

# A write while node-0 is down: it falls behind, so its rejoining below means catching up.
enqueue_second() { second="$("$cli" --address "$all" enqueue emails '{"to":"bob@example.com"}')"; }
until_ok 60 enqueue_second || fail "no enqueue acknowledged with node-0 down"
echo "ok: enqueued $second with node-0 down"

"$dir/node-0/start.sh" &
restarted_pid=$!
serving_twice() { [[ "$(grep -c "jobbroker: serving" "$dir/node-0/stdout.log")" -ge 2 ]]; }
until_ok 60 serving_twice || fail "the restarted node-0 did not serve within 60 s"
until_ok 60 all_in_sync || fail "node-0 did not rejoin every in-sync set within 60 s: $(rows)"
echo "ok: node-0 restarted and in sync again"

kill -TERM "$restarted_pid"
code=0
wait "$restarted_pid" || code=$?
[[ "$code" -eq 0 ]] || fail "the restarted node-0 exited $code on SIGTERM; its log ends:
$(tail -n 30 "$dir/node-0/stderr.log")"
restarted_pid=""
# SIGTERM, as Ctrl-C's SIGINT would be: a background job of a script ignores SIGINT.
kill -TERM "$script_pid"
code=0
wait "$script_pid" || code=$?
script_pid=""
[[ "$code" -eq 0 ]] || fail "cluster.sh exited $code on SIGTERM"
left="$(pids_under_dir)"
[[ -z "$left" ]] || fail "processes left running: $left"
echo "ok: SIGTERM stopped etcd and every node"
echo "1 passed, 0 failed"
