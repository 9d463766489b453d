#!/usr/bin/env bash
# Leader-kill failover of cluster mode, measured between real processes: a real etcd and three
# jobbroker nodes on loopback (RF 3, min_in_sync 2). KILLS times: find the node that leads the
# queue's partition (QueueInfo.leader_node_id), enqueue BURST jobs there, kill -9 it, and time
# until the cluster acknowledges an enqueue of that queue again (jobbroker-cli given every
# address, as a client would be: it goes to the new leader); then restart the killed node and
# let it rejoin.
# At the end every acknowledged job is looked up on the partition's leader. Prints each failover,
# then p50, max and the count of acknowledged jobs not found (must be 0). The issue's targets:
# p50 <= 5 s, max <= 10 s over >= 20 kills.
#   bench/cluster-failover.sh            # 20 kills
#   KILLS=50 bench/cluster-failover.sh
#   MODE=rolling ROUNDS=3 bench/cluster-failover.sh   # SIGTERM each node in turn (target: <= 1 s)
# Environment: BUILD_DIR (default: ../build next to this script), KILLS (20), REJOIN_S (3),
# BURST (25: jobs enqueued at the leader just before each kill), MODE (kill, or rolling), ROUNDS
# (3: rolling restarts of all three nodes).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
broker="$build_dir/server/jobbroker"
cli="$build_dir/client/cpp/jobbroker-cli"
kills="${KILLS:-20}"
rejoin="${REJOIN_S:-3}"
BURST="${BURST:-25}"
for binary in "$broker" "$cli"; do
  [ -x "$binary" ] || { echo "cluster-failover: $binary is not built" >&2; exit 1; }
done
command -v etcd >/dev/null || { echo "cluster-failover: etcd is missing (apt-get install etcd-server)" >&2; exit 1; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-failover.XXXXXX")"
pids=()
cleanup() {
  exec 2>/dev/null  # bash reports each killed background job
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd_client=$(free_port)
etcd_peer=$(free_port)
etcd --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$etcd_client" \
  --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" >"$tmp/etcd.log" 2>&1 &
pids+=($!)

grpc_ports=() http_ports=() node_pids=()
for n in 0 1 2; do grpc_ports[$n]=$(free_port); http_ports[$n]=$(free_port); done
start_node() {
  local n=$1
  "$broker" --listen "127.0.0.1:${grpc_ports[$n]}" --http-listen "127.0.0.1:${http_ports[$n]}" \
    --data-dir "$tmp/node-$n" --partitions 2 --cluster-etcd "http://127.0.0.1:$etcd_client" \
    --node-id "node-$n" --log-format text >>"$tmp/node-$n.out" 2>>"$tmp/node-$n.log" &
  node_pids[$n]=$!
  pids+=($!)
}
sleep 1
for n in 0 1 2; do start_node $n; done

queue=emails
acked="$tmp/acked"
: >"$acked"
all_addresses() {
  local list="" n
  for n in 0 1 2; do list="$list${list:+,}127.0.0.1:${grpc_ports[$n]}"; done
  echo "$list"
}
# Enqueues through the cluster until it acknowledges (60 s at most); the job id goes to $acked.
enqueue_anywhere() {
  local deadline=$((SECONDS + 60)) id
  while [ $SECONDS -lt $deadline ]; do
    if id=$("$cli" --address "$(all_addresses)" --timeout 2s enqueue "$queue" x 2>/dev/null); then
      echo "$id" >>"$acked"
      return 0
    fi
    sleep 0.05
  done
  return 1
}
# The number of the node that leads the queue's partition, as node $1 (or any live one) sees it.
leader_of_queue() {
  local n json
  for n in 0 1 2; do
    json=$("$cli" --address "127.0.0.1:${grpc_ports[$n]}" --timeout 2s --json queues 2>/dev/null) || continue
    python3 -c 'import json,sys
data = json.load(sys.stdin)
for q in data if isinstance(data, list) else data.get("queues", []):
    if q["name"] == sys.argv[1] and q.get("leaderNodeId", "").startswith("node-"):
        print(q["leaderNodeId"][5:]); sys.exit(0)
sys.exit(1)' "$queue" <<<"$json" && return 0
  done
  return 1
}
now() { date +%s.%N; }

if [ "${MODE:-kill}" = rolling ]; then
  # A rolling restart, as a Helm upgrade does it: each node in turn gets SIGTERM (it hands its
  # partitions over first), exits, and starts again, ROUNDS times, while one producer enqueues
  # without pause through every address. The longest gap between two acknowledgements is how
  # long the queue's partition was unavailable (plus one enqueue's own time, shown as the
  # median gap).
  enqueue_anywhere || { echo "the cluster took no write" >&2; exit 1; }
  stamps="$tmp/stamps"
  (
    while :; do
      if id=$("$cli" --address "$(all_addresses)" --timeout 5s enqueue "$queue" r 2>/dev/null); then
        echo "$id" >>"$acked"
        now >>"$stamps"
      fi
    done
  ) &
  producer=$!
  pids+=($producer)
  for ((round = 1; round <= ${ROUNDS:-3}; round++)); do
    for n in 0 1 2; do
      kill -TERM "${node_pids[$n]}"
      wait "${node_pids[$n]}" 2>/dev/null || true
      grep -o 'handed_over.*' "$tmp/node-$n.log" | tail -n 1 | sed "s/^/round $round node-$n: /"
      start_node "$n"
      sleep "$rejoin"
    done
  done
  kill "$producer" 2>/dev/null || true
  wait "$producer" 2>/dev/null || true
  missing=0
  while read -r id; do
    "$cli" --address "$(all_addresses)" --timeout 2s get "$id" >/dev/null 2>&1 || missing=$((missing + 1))
  done <"$acked"
  python3 - "$stamps" "$missing" "$(wc -l <"$acked")" <<'PY'
import sys
t = [float(x) for x in open(sys.argv[1])]
gaps = sorted(b - a for a, b in zip(t, t[1:]))
print("rolling restart: %d acknowledged, not found after: %s; gap between acks: median %.3f s, "
      "max %.3f s" % (int(sys.argv[3]), sys.argv[2], gaps[len(gaps) // 2], gaps[-1]))
PY
  [ "$missing" -eq 0 ]
  exit
fi

times=()
for ((k = 1; k <= kills; k++)); do
  enqueue_anywhere || { echo "the cluster took no write" >&2; exit 1; }
  leader=$(leader_of_queue) || { echo "no node names the queue's leader" >&2; exit 1; }
  # Jobs acknowledged by this leader just before it dies: the ones most at risk.
  for ((i = 0; i < BURST; i++)); do
    id=$("$cli" --address "127.0.0.1:${grpc_ports[$leader]}" --timeout 2s enqueue "$queue" y) &&
      echo "$id" >>"$acked"
  done
  kill -9 "${node_pids[$leader]}"
  wait "${node_pids[$leader]}" 2>/dev/null || true
  killed_at=$(now)
  enqueue_anywhere || { echo "kill $k: no new leader within 60 s" >&2; exit 1; }
  took=$(echo "$(now) - $killed_at" | bc)
  times+=("$took")
  next=$(leader_of_queue || echo "?")
  printf 'kill %2d: node-%s killed, node-%s acknowledged after %.2f s\n' "$k" "$leader" "$next" "$took"
  start_node "$leader"
  sleep "$rejoin"
done

enqueue_anywhere
missing=0
while read -r id; do
  "$cli" --address "$(all_addresses)" --timeout 2s get "$id" >/dev/null 2>&1 || missing=$((missing + 1))
done <"$acked"
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
p50=$(echo "$sorted" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
max=$(echo "$sorted" | tail -n 1)
printf 'failovers: %d, p50 %.2f s, max %.2f s; acknowledged %d, not found after: %d\n' \
  "$kills" "$p50" "$max" "$(wc -l <"$acked")" "$missing"
[ "$missing" -eq 0 ]
