#!/usr/bin/env bash
# Cluster mode's cost and its scale-out, measured between real processes on loopback in one
# sitting, against a single node measured in the same run:
#   1. single  one broker, no etcd (the embedded default, --partitions PARTITIONS);
#   2. rf3     a real etcd and three nodes, --replication-factor 3 --min-in-sync 2: every write
#              is on two nodes' disks (fsynced) before it is answered;
#   3. rf1     the same three nodes with --replication-factor 1: no replication, each partition
#              on one node, for the scale-out;
#   4. one     one such node alone (a cluster of one at RF 1): the scale-out within cluster mode.
# In 1 and 2, jobbroker-bench runs against the node that leads the queue's partition (as the
# C++ client, given every address, goes straight to it): enqueue with 1 in flight (the latency
# of one synced answer) and with 64 (group commit), and e2e as streaming workers (4 workers, 64
# jobs in flight each: enqueue -> push -> ack), and the latency from enqueue to the handler's start
# at 1,000 jobs/s (four senders sharing the rate, one idle streaming worker). Broker CPU per job
# is the user+system time of every broker process (and of etcd, shown apart) over the run, from
# /proc, divided by the jobs.
# Scale-out (rf1 vs single, and rf1 vs one): SPREAD streaming benches at once, each on its own
# queue; the queues are picked so that in rf1 each partition's leader gets the same share. Prints a table, the
# ratios, and every run's JSON line to RESULTS if set.
#
#   bench/cluster-throughput.sh
#   ROUNDS=3 bench/cluster-throughput.sh     # medians of 3 rounds per figure
# Environment: BUILD_DIR (default ../build), JOBS (20000), SERIAL_JOBS (2000), LATENCY_JOBS (3000), ROUNDS (1),
# PARTITIONS (3), SPREAD (3), PAYLOAD_BYTES (100), TMPDIR (where the data dirs go).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
broker="$build_dir/server/jobbroker"
bench="$build_dir/bench/jobbroker-bench"
cli="$build_dir/client/cpp/jobbroker-cli"
jobs="${JOBS:-20000}"
serial_jobs="${SERIAL_JOBS:-2000}"
latency_jobs="${LATENCY_JOBS:-3000}"
rounds="${ROUNDS:-1}"
partitions="${PARTITIONS:-3}"
spread="${SPREAD:-3}"
payload="${PAYLOAD_BYTES:-100}"
for binary in "$broker" "$bench" "$cli"; do
  [ -x "$binary" ] || { echo "cluster-throughput: $binary is not built" >&2; exit 1; }
done
command -v etcd >/dev/null || { echo "cluster-throughput: etcd is missing (apt-get install etcd-server)" >&2; exit 1; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-cluster-bench.XXXXXX")"
pids=()
cleanup() {
  exec 2>/dev/null
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
results="$tmp/results.jsonl"
: >"$results"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# CPU ticks (user + system) of the given pids, summed.
cpu_ticks() {
  local total=0 pid fields
  for pid in "$@"; do
    # Fields 14 and 15 of /proc/PID/stat, counted after the ")" that ends the command name.
    fields=$(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')
    total=$((total + fields))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)

broker_pids=() etcd_pid="" addresses=()
stop_all() {
  local pid
  for pid in "${broker_pids[@]}" $etcd_pid; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${broker_pids[@]}" $etcd_pid; do wait "$pid" 2>/dev/null || true; done
  broker_pids=() etcd_pid="" addresses=()
}

# start_single DIR: one broker, no cluster.
start_single() {
  local dir=$1 port http
  mkdir -p "$dir"
  port=$(free_port) http=$(free_port)
  "$broker" --listen "127.0.0.1:$port" --http-listen "127.0.0.1:$http" --data-dir "$dir/data" \
    --partitions "$partitions" --log-level warn >"$dir/out" 2>"$dir/log" &
  broker_pids=($!) addresses=("127.0.0.1:$port")
  pids+=($!)
  await_serving
}

# start_cluster DIR RF MIN_IN_SYNC [NODES]: etcd and NODES nodes (3); the partitions are placed
# once all have registered (at RF 1 the first node up would otherwise get every partition).
start_cluster() {
  local dir=$1 rf=$2 min=$3 count=${4:-3} n client peer port http
  mkdir -p "$dir"
  client=$(free_port) peer=$(free_port)
  etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
  etcd_pid=$!
  pids+=($!)
  sleep 1
  for ((n = 0; n < count; n++)); do
    port=$(free_port) http=$(free_port)
    "$broker" --listen "127.0.0.1:$port" --http-listen "127.0.0.1:$http" --data-dir "$dir/node-$n" \
      --partitions "$partitions" --cluster-etcd "http://127.0.0.1:$client" --node-id "node-$n" \
      --replication-factor "$rf" --min-in-sync "$min" --cluster-initial-nodes "$count" --log-level warn >"$dir/node-$n.out" 2>"$dir/node-$n.log" &
    broker_pids+=($!) addresses+=("127.0.0.1:$port")
    pids+=($!)
  done
  await_serving
}

all_addresses() { local IFS=,; echo "${addresses[*]}"; }

# Every partition led by its preferred replica (the first of its placement: the leaders spread
# over the nodes), every replica in sync (60 s at most). Measuring earlier would catch the first
# node up leading everything, and then the hand-backs in the middle of a run.
await_serving() {
  local deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ]; do
    if "$cli" --address "$(all_addresses)" --timeout 2s --json cluster 2>/dev/null | python3 -c '
import json, sys
c = json.load(sys.stdin)
rf = c.get("replicationFactor", 1)
ps = c.get("partitions", [])
sys.exit(0 if ps and all(p.get("leaderNodeId") == p.get("replicas", [""])[0] and len(p.get("inSync", [])) == rf for p in ps) else 1)' 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "cluster-throughput: the brokers did not serve every partition within 60 s" >&2
  # The run's directory goes with the exit: show the end of each log first.
  local log
  for log in "$tmp"/*/*.log "$tmp"/*/log; do
    [ -f "$log" ] || continue
    echo "--- $log" >&2
    tail -n 5 "$log" >&2
  done
  exit 1
}

# partition_of QUEUE: core/ids.cc's PartitionOfQueue (FNV-1a, 64 bits, modulo the count).
partition_of() {
  python3 -c '
import sys
h = 14695981039346656037
for b in sys.argv[1].encode():
    h = ((h ^ b) * 1099511628211) % (1 << 64)
print(h % int(sys.argv[2]))' "$1" "$partitions"
}

# leader_address QUEUE: the address of the node that leads the queue's partition.
leader_address() {
  local p
  p=$(partition_of "$1")
  "$cli" --address "$(all_addresses)" --timeout 2s --json cluster | python3 -c '
import json, sys
c = json.load(sys.stdin)
for p in c["partitions"]:
    if p.get("partition", 0) == int(sys.argv[1]):
        print(p["leaderAddress"])' "$p"
}

# measure LABEL MODE QUEUE ARGS...: one jobbroker-bench run against the queue's leader; prints
# "jobs_per_sec p50_ms p99_ms broker_us_per_job etcd_us_per_job" and keeps the JSON line.
measure() {
  local label=$1 mode=$2 queue=$3 address before_b before_e line
  shift 3
  address=$(leader_address "$queue")
  before_b=$(cpu_ticks "${broker_pids[@]}")
  before_e=$([ -n "$etcd_pid" ] && cpu_ticks "$etcd_pid" || echo 0)
  line=$("$bench" "$mode" --address "$address" --queue "$queue" --payload-bytes "$payload" "$@" | grep '^{')
  local used_b used_e
  used_b=$(($(cpu_ticks "${broker_pids[@]}") - before_b))
  used_e=$(($([ -n "$etcd_pid" ] && cpu_ticks "$etcd_pid" || echo 0) - before_e))
  echo "${line%\}},\"label\":\"$label\",\"broker_cpu_s\":$(echo "$used_b / $hz" | bc -l),\"etcd_cpu_s\":$(echo "$used_e / $hz" | bc -l)}" >>"$results"
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
done = max(r["done"], 1)
print("%.1f %.3f %.3f %.1f %.1f" % (r["jobs_per_sec"], r["p50_ms"], r["p99_ms"],
      int(sys.argv[2]) / int(sys.argv[4]) * 1e6 / done, int(sys.argv[3]) / int(sys.argv[4]) * 1e6 / done))' \
    "$line" "$used_b" "$used_e" "$hz"
}

# spread_queues: SPREAD queue names, each on a partition of its own (round-robin over them).
spread_queues() {
  local want=0 i=0 q
  local -a names=()
  while [ ${#names[@]} -lt "$spread" ] && [ $i -lt 10000 ]; do
    q="spread-$i"
    if [ "$(partition_of "$q")" -eq $((want % partitions)) ]; then
      names+=("$q")
      want=$((want + 1))
    fi
    i=$((i + 1))
  done
  echo "${names[@]}"
}

# scale LABEL: SPREAD streaming benches at once, one per queue, each at its queue's leader;
# prints "total_jobs_per_sec broker_us_per_job".
scale() {
  local label=$1 q before after started ended total=0
  local -a bench_pids=() outs=()
  before=$(cpu_ticks "${broker_pids[@]}")
  started=$(date +%s.%N)
  for q in $(spread_queues); do
    "$bench" stream --address "$(leader_address "$q")" --queue "$q" --payload-bytes "$payload" \
      --workers 2 --concurrency 64 --jobs "$jobs" >"$tmp/scale-$q.out" &
    bench_pids+=($!) outs+=("$tmp/scale-$q.out")
  done
  for pid in "${bench_pids[@]}"; do wait "$pid"; done
  ended=$(date +%s.%N)
  after=$(cpu_ticks "${broker_pids[@]}")
  for f in "${outs[@]}"; do grep '^{' "$f" | sed "s/}\$/,\"label\":\"$label\"}/" >>"$results"; done
  total=$((jobs * ${#outs[@]}))
  python3 -c 'import sys; t, s, c, hz = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]); print("%.1f %.1f" % (t / s, c / hz * 1e6 / t))' \
    "$total" "$(echo "$ended - $started" | bc -l)" "$((after - before))" "$hz"
}

declare -A fig
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# record CONFIG NAME "v1 v2 ...": appends each value to fig[CONFIG.NAME.i].
record() {
  local key=$1 i=0 v
  for v in $2; do fig[$key.$i]="${fig[$key.$i]:-} $v"; i=$((i + 1)); done
}

for ((round = 1; round <= rounds; round++)); do
  for config in single rf3 rf1 one; do
    dir="$tmp/$config-$round"
    case $config in
      single) start_single "$dir" ;;
      rf3) start_cluster "$dir" 3 2 ;;
      rf1) start_cluster "$dir" 1 1 ;;
      one) start_cluster "$dir" 1 1 1 ;;
    esac
    echo "round $round: $config up (${addresses[*]})" >&2
    if [ "$config" = single ] || [ "$config" = rf3 ]; then
      record "$config.serial" "$(measure "$config serial" enqueue serial-$round --concurrency 1 --jobs "$serial_jobs")"
      record "$config.enqueue" "$(measure "$config enqueue" enqueue enqueue-$round --concurrency 64 --jobs "$jobs")"
      record "$config.e2e" "$(measure "$config e2e" stream e2e-$round --workers 4 --concurrency 64 --jobs "$jobs")"
      # enqueue -> handler start at a steady 1,000 jobs/s (one idle streaming worker). Four
      # senders, each waiting for its answer: one alone falls behind the rate at RF=3, where an
      # Enqueue takes longer than the 1 ms between sends.
      record "$config.latency" "$(measure "$config latency" latency latency-$round --rate 1000 --senders 4 --in-flight 16 --jobs "$latency_jobs")"
    fi
    if [ "$config" != rf3 ]; then record "$config.scale" "$(scale "$config scale")"; fi
    stop_all
  done
done

m() { median ${fig[$1]}; }
echo
echo "cluster-throughput: $rounds round(s), medians; JOBS=$jobs, PARTITIONS=$partitions, payload $payload B, $(nproc) cores"
printf '%-7s %12s %14s %12s %16s %13s %16s\n' config "enqueue/s" "enq p50/p99 ms" "e2e jobs/s" "1-in-flight p50/p99" "cpu µs/job e2e" "cpu µs/job enqueue"
for config in single rf3; do
  printf '%-7s %12.0f %14s %12.0f %16s %13.1f %16.1f\n' "$config" "$(m $config.enqueue.0)" \
    "$(m $config.enqueue.1)/$(m $config.enqueue.2)" "$(m $config.e2e.0)" \
    "$(m $config.serial.1)/$(m $config.serial.2)" "$(m $config.e2e.3)" "$(m $config.enqueue.3)"
done
echo "etcd cpu µs/job (rf3 e2e): $(m rf3.e2e.4)"
for config in single rf3; do
  echo "$config: enqueue -> start at 1,000 jobs/s offered ($(m $config.latency.0) reached): p50 $(m $config.latency.1) ms, p99 $(m $config.latency.2) ms (target for rf3: p99 <= 5 ms)"
done
python3 - "$(m rf3.e2e.0)" "$(m single.e2e.0)" "$(m rf3.enqueue.0)" "$(m single.enqueue.0)" \
  "$(m rf1.scale.0)" "$(m single.scale.0)" "$(m rf3.e2e.3)" "$(m single.e2e.3)" "$(m rf1.scale.1)" "$(m single.scale.1)" \
  "$(m one.scale.0)" "$(m one.scale.1)" "$spread" <<'PY'
import sys
rf3e, se, rf3q, sq, r1s, ss, rf3c, sc, r1c, scc, os_, oc = map(float, sys.argv[1:13])
spread = sys.argv[13]
print("RF=3 e2e / single-node e2e: %.2fx (target >= 0.5x)" % (rf3e / se))
print("RF=3 enqueue / single-node enqueue (64 in flight): %.2fx" % (rf3q / sq))
print("broker CPU per e2e job, all nodes: RF=3 %.1f µs vs single %.1f µs (%.2fx)" % (rf3c, sc, rf3c / sc))
print("scale-out, %s queues: RF=1 over 3 nodes %.0f jobs/s vs one node %.0f jobs/s: %.2fx (target >= 1.0x); "
      "broker CPU per job %.1f vs %.1f µs" % (spread, r1s, ss, r1s / ss, r1c, scc))
print("scale-out within cluster mode: RF=1 over 3 nodes %.0f jobs/s vs a cluster of one node %.0f "
      "jobs/s: %.2fx; broker CPU per job %.1f vs %.1f µs" % (r1s, os_, r1s / os_, r1c, oc))
PY
if [ -n "${RESULTS:-}" ]; then cat "$results" >>"$RESULTS"; fi
