#!/usr/bin/env bash
# A three-node jobbroker cluster on this machine, to try cluster mode (docs/cluster.md): one etcd
# and three nodes on loopback, each node with its own data dir, every partition replicated on all
# three (min in-sync 2). Runs in the foreground; Ctrl-C (or SIGTERM) stops the nodes (each hands
# its partitions over first) and etcd.
#
#   make cluster                     # builds first, then runs this
#   scripts/cluster.sh               # from an existing build (BUILD, default build)
#
# DIR (default ./cluster-data) holds etcd's and the nodes' data and logs: a second start with the
# same DIR comes back with the same jobs. Ports: etcd ETCD_PORT (2379) and ETCD_PORT+1; node N's
# gRPC GRPC_PORT+N (7070...), its HTTP (dashboard, /metrics) HTTP_PORT+N (8080...).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-build}"
[[ "$build" = /* ]] || build="$root/$build"
dir="${DIR:-./cluster-data}"
etcd_port="${ETCD_PORT:-2379}"
grpc_port="${GRPC_PORT:-7070}"
http_port="${HTTP_PORT:-8080}"
partitions="${PARTITIONS:-8}"
jobbroker="$build/server/jobbroker"
cli="$build/client/cpp/jobbroker-cli"
etcd_binary="${ETCD_BINARY:-/usr/bin/etcd}"

for program in "$jobbroker" "$cli"; do
  [[ -x "$program" ]] || { echo "cluster.sh: $program is missing: run make build" >&2; exit 2; }
done
[[ -x "$etcd_binary" ]] || {
  echo "cluster.sh: $etcd_binary is missing: scripts/install-deps.sh installs etcd-server" >&2
  exit 2
}
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

pids=()
stop() {
  trap - INT TERM EXIT
  echo "cluster.sh: stopping (each node hands its partitions over first)"
  # One node at a time, etcd last: a node hands over to the others, through etcd (the last one
  # has no one to hand over to and gives up after 5 s).
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  exit 0
}
trap stop INT TERM
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' EXIT

# Waits up to 30 s for `test` (a command) to succeed; `what` names it in the failure.
await() {
  local what="$1"
  shift
  for _ in $(seq 300); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  echo "cluster.sh: $what did not come up within 30 s; see $dir" >&2
  exit 1
}

"$etcd_binary" --name etcd --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-cluster "etcd=http://127.0.0.1:$((etcd_port + 1))" >"$dir/etcd.log" 2>&1 &
pids+=($!)
await "etcd on port $etcd_port" bash -c "exec 3<>/dev/tcp/127.0.0.1/$etcd_port" 2>/dev/null

addresses=()
for n in 0 1 2; do
  mkdir -p "$dir/node-$n"
  # Its command in a file of its own: after a kill -9, `$dir/node-N/start.sh &` brings it back.
  cat >"$dir/node-$n/start.sh" <<START
#!/usr/bin/env bash
exec '$jobbroker' --listen 127.0.0.1:$((grpc_port + n)) --http-listen 127.0.0.1:$((http_port + n)) \\
  --data-dir '$dir/node-$n/data' --cluster-etcd http://127.0.0.1:$etcd_port --node-id node-$n \\
  --partitions $partitions --replication-factor 3 --min-in-sync 2 --cluster-initial-nodes 3 \\
  >>'$dir/node-$n/stdout.log' 2>>'$dir/node-$n/stderr.log'
START
  chmod +x "$dir/node-$n/start.sh"
  : >"$dir/node-$n/stdout.log"
  "$dir/node-$n/start.sh" &
  pids+=($!)
  addresses+=("127.0.0.1:$((grpc_port + n))")
done
for n in 0 1 2; do
  await "node-$n" grep -q "jobbroker: serving" "$dir/node-$n/stdout.log"
done
all="$(IFS=,; echo "${addresses[*]}")"
# Placed and led: a row per partition in `jobbroker-cli cluster`, and a leader in each.
all_led() {
  local rows
  rows="$("$cli" --address "$all" cluster 2>/dev/null | awk '/^PARTITION/ {t = 1; next} t && NF')"
  [[ "$(grep -c . <<<"$rows")" -eq "$partitions" ]] && ! awk '{print $2}' <<<"$rows" | grep -qx -- -
}
await "the partitions' leaders" all_led
# And serving: listing the queues asks every partition's leader.
await "the partitions' leaders' answers" "$cli" --address "$all" queues >/dev/null 2>&1

"$cli" --address "$all" cluster
cat <<EOF

cluster ready: etcd at 127.0.0.1:$etcd_port, nodes at $all
  dashboards   http://127.0.0.1:$http_port/  http://127.0.0.1:$((http_port + 1))/  http://127.0.0.1:$((http_port + 2))/
  the cluster  http://127.0.0.1:$((http_port + 1))/#/cluster  (nodes, leaders, epochs, in-sync sets, failovers)
  try          $cli --address $all enqueue emails '{"to":"ada@example.com"}'
  watch        watch -n 0.5 $cli --address $all cluster
  a failover   kill -9 ${pids[1]}   (node-0; node-1 is ${pids[2]}, node-2 ${pids[3]}), then watch
               its partitions move on node-1's cluster page; $dir/node-0/start.sh & brings it back
  data, logs   $dir
Ctrl-C stops the cluster.
EOF
# Until Ctrl-C: a node killed meanwhile leaves the others running (that is the point).
while true; do
  wait || true
  sleep 1
done
