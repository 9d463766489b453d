# Sourced by cluster_example.sh, which every client's install test runs: a real etcd and three
# jobbroker nodes on loopback, as a cluster deployment runs them, so that each client's installed
# example worker shows it rides out the death of its queue's leader without losing a job.
#
# cluster_start BROKER DIR
#   Starts etcd (Debian etcd-server) and three nodes of BROKER (2 partitions, each replicated on
#   all three, a write answered once 2 hold it), their data and logs in DIR, and returns once every
#   partition has a leader and all three nodes in sync (asked with jobbroker-cli: $JOBBROKER_CLI,
#   else the one built next to BROKER). Sets
#   cluster_addresses (the three HOST:PORT, comma-separated, what a client is given),
#   cluster_node_pids (an array), cluster_etcd_pid. On failure prints why and returns 1.
# cluster_enqueue QUEUE PAYLOAD KEY
#   One job with dedup key KEY, through every node's address as a client of the cluster gives
#   them; retried for up to 30 s.
# cluster_leader QUEUE
#   Prints the index (0-2) of the node that leads QUEUE's partition.
# cluster_kill9 N
#   kill -9 of node N: a dead machine.
# cluster_wait_completed QUEUE N
#   Until QUEUE holds N jobs, every one COMPLETED, for up to 60 s; otherwise prints the counts
#   and returns 1.
# cluster_leader_kill_check QUEUE PAYLOAD_FUNCTION START_FUNCTION
#   What each install test runs with its example worker: see below.
# cluster_stop
#   SIGTERM to the nodes still alive (SIGKILL after 30 s), then etcd. Call it from the shell
#   that started them.

_cluster_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The CLI against every node, as a client of the cluster calls it.
_cluster_cli() {
  "$cluster_cli" --address "$cluster_addresses" --timeout 5s "$@"
}

cluster_start() {
  local broker="$1" dir="$2"
  cluster_cli="${JOBBROKER_CLI:-$(dirname "$broker")/../client/cpp/jobbroker-cli}"
  mkdir -p "$dir"
  local etcd_client etcd_peer
  etcd_client="$(_cluster_port)" etcd_peer="$(_cluster_port)"
  local etcd_url="http://127.0.0.1:$etcd_client"
  etcd --data-dir "$dir/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" >"$dir/etcd.log" 2>&1 &
  cluster_etcd_pid=$!
  # A retry comes 0.1 s after a failure: the example's job, failed by a node's death, runs again
  # at once.
  printf '{"defaultPolicy": {"retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s"}}}\n' \
    >"$dir/config.json"
  local addresses=() n
  for n in 0 1 2; do addresses+=("127.0.0.1:$(_cluster_port)"); done
  cluster_addresses="$(
    IFS=,
    echo "${addresses[*]}"
  )"
  cluster_node_pids=()
  cluster_node_args=()
  for n in 0 1 2; do
    cluster_node_args+=("$broker --listen ${addresses[$n]} --http-listen 127.0.0.1:0 --data-dir $dir/node-$n --partitions 2 --cluster-etcd $etcd_url --node-id node-$n --cluster-initial-nodes 3 --config $dir/config.json --log-level warn")
    # shellcheck disable=SC2086 # the node's arguments, split on purpose (no spaces in them)
    ${cluster_node_args[$n]} >>"$dir/node-$n.log" 2>&1 &
    cluster_node_pids+=($!)
  done
  local deadline=$((SECONDS + 60)) info
  while ((SECONDS < deadline)); do
    if info="$(_cluster_cli --json cluster 2>/dev/null)" &&
      python3 -c '
import json, sys
info = json.loads(sys.argv[1])
parts = info.get("partitions", [])
ok = parts and all(p.get("leaderNodeId") and len(p.get("inSync", [])) == 3 for p in parts)
sys.exit(0 if ok else 1)' "$info"; then
      return 0
    fi
    sleep 0.2
  done
  echo "cluster_start: not every partition had a leader and 3 nodes in sync within 60 s; logs in $dir" >&2
  tail -n 5 "$dir"/node-*.log >&2
  return 1
}

cluster_enqueue() {
  # With a dedup key, a retry after an unknown outcome (a node dying under the call, a partition
  # between leaders) cannot add the job twice.
  local deadline=$((SECONDS + 30)) out
  until out="$(_cluster_cli enqueue "$1" "$2" --dedup-key "$3" 2>&1)"; do
    if ((SECONDS >= deadline)); then
      echo "cluster_enqueue: $out" >&2
      return 1
    fi
    sleep 0.2
  done
}

# QUEUE as the cluster reports it, on one line: the index of the node that leads its partition
# ("-" while none does), then its non-zero counts by state: "1 COMPLETED=12 READY=3". Fails if the
# cluster does not answer or does not know the queue.
_cluster_queue() {
  local info
  info="$(_cluster_cli --json queues 2>/dev/null)" || return 1
  python3 -c '
import json, sys
for q in json.loads(sys.argv[1]):
    if q.get("name") == sys.argv[2]:
        leader = q.get("leaderNodeId", "").replace("node-", "") or "-"
        counts = q.get("counts", {})
        shown = [k.replace("JOB_STATE_", "") + "=" + v for k, v in sorted(counts.items()) if int(v)]
        print(" ".join([leader] + shown))
        sys.exit(0)
sys.exit("no queue " + sys.argv[2])' "$info" "$1"
}

cluster_leader() {
  local line
  line="$(_cluster_queue "$1")" || return 1
  [[ "${line%% *}" != "-" ]] || return 1
  echo "${line%% *}"
}

cluster_kill9() {
  kill -KILL "${cluster_node_pids[$1]}" 2>/dev/null || true
  wait "${cluster_node_pids[$1]}" 2>/dev/null || true
}

# QUEUE's non-zero counts by state, "COMPLETED=12 READY=3"; fails if the cluster does not answer.
cluster_counts() {
  local line
  line="$(_cluster_queue "$1")" || return 1
  [[ "$line" == *" "* ]] && echo "${line#* }" || echo ""
}

cluster_wait_completed() {
  local queue="$1" want="$2" deadline=$((SECONDS + 60)) counts=""
  while ((SECONDS < deadline)); do
    counts="$(cluster_counts "$queue")" && [[ "$counts" == "COMPLETED=$want" ]] && return 0
    sleep 0.2
  done
  echo "cluster_wait_completed: queue $queue holds ${counts:-nothing}, not $want jobs all completed" >&2
  return 1
}

# cluster_leader_kill_check QUEUE PAYLOAD_FUNCTION START_FUNCTION
#   The check every install test makes with its example worker: 30 jobs wait in QUEUE; then
#   START_FUNCTION starts the example worker in the background, given cluster_addresses and
#   working QUEUE, and sets worker_pid; once 1 job is done (the others still running or waiting),
#   kill -9 of the queue's leader; 20 jobs more; then every one of the 50 must complete and the
#   worker still run. PAYLOAD_FUNCTION N prints the payload of job N (what the example reads).
cluster_leader_kill_check() {
  local queue="$1" payload="$2" start="$3" i leader deadline counts=""
  for i in $(seq 1 30); do cluster_enqueue "$queue" "$("$payload" "$i")" "job-$i" || return 1; done
  "$start"
  deadline=$((SECONDS + 60))
  while :; do
    counts="$(cluster_counts "$queue")"
    [[ "$counts" =~ COMPLETED= ]] && break
    if ((SECONDS >= deadline)) || ! kill -0 "$worker_pid" 2>/dev/null; then
      echo "cluster: the example worker did not get going (queue $queue: ${counts:-no answer})" >&2
      return 1
    fi
    sleep 0.05
  done
  leader="$(cluster_leader "$queue")" || return 1
  cluster_kill9 "$leader"
  echo "cluster: $counts; kill -9 of node-$leader, the leader of $queue"
  for i in $(seq 31 50); do cluster_enqueue "$queue" "$("$payload" "$i")" "job-$i" || return 1; done
  cluster_wait_completed "$queue" 50 || return 1
  kill -0 "$worker_pid" 2>/dev/null || {
    echo "cluster: the example worker exited" >&2
    return 1
  }
  echo "cluster: all 50 jobs completed; node-$(cluster_leader "$queue") leads $queue now"
}

cluster_stop() {
  local pid
  for pid in "${cluster_node_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${cluster_node_pids[@]}"; do
    for _ in $(seq 1 300); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  kill -KILL "$cluster_etcd_pid" 2>/dev/null || true
  wait "$cluster_etcd_pid" 2>/dev/null || true
  cluster_etcd_pid="" cluster_node_pids=()
}
