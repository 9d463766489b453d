# Sourced by bench/peers/run.sh and dag.sh: the servers they compare, each started fresh with its
# own data dir under $tmp and stopped by PID, and the CPU each process used. The caller sets
# `tmp` (a temp dir, removed at exit), `broker` (the jobbroker binary) and `node_dir` (for a free
# port) before calling start_server.
#
# Configurations: jobbroker (fsync before every answer), jobbroker-group (DURABILITY_GROUP),
# redis-aof-everysec and redis-aof-always (Redis for BullMQ, AOF fsynced once a second or before
# replies), beanstalkd-f50 and beanstalkd-f0 (binlog fsynced at most every 50 ms, or on every
# write).

clk_tck="$(getconf CLK_TCK)"
server_pid=""
server_config=""
server_seq=0
tmp=""
peers_script="$(basename "$0")"

cleanup() {
  if [[ -n "$server_pid" ]] && alive "$server_pid"; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  [[ -z "$tmp" ]] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

system_of() {
  case "$1" in
    jobbroker*) echo jobbroker ;;
    redis-*) echo bullmq ;;
    beanstalkd-*) echo beanstalkd ;;
  esac
}

# True while `pid` runs (a child that has exited but is not yet reaped is a zombie: not alive).
alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "${stat:0:1}" != Z ]]
}

# User+system CPU seconds `pid` has used (all its threads), from /proc/PID/stat.
cpu_seconds() {
  local stat f
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 0; return; }
  stat="${stat##*) }"  # fields from 3 (state) on
  read -ra f <<<"$stat"
  awk -v u="${f[11]}" -v s="${f[12]}" -v t="$clk_tck" 'BEGIN { printf "%.3f", (u + s) / t }'
}

# User+system CPU seconds of this shell's reaped children: read before and after a load run,
# the difference is the load process's CPU (timeout(1) waits for it, and this shell for timeout),
# the same way for jobbroker-bench and for node.
children_cpu_seconds() {
  local stat f
  stat="$(cat "/proc/$$/stat")"
  stat="${stat##*) }"
  read -ra f <<<"$stat"
  awk -v u="${f[13]}" -v s="${f[14]}" -v t="$clk_tck" 'BEGIN { printf "%.3f", (u + s) / t }'
}

# Waits up to `tries` x 0.1 s for 127.0.0.1:`port` to accept a connection while `pid` lives.
wait_port() {
  local pid="$1" port="$2" tries="${3:-100}"
  for ((i = 0; i < tries; i++)); do
    alive "$pid" || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# Starts `config` with a fresh data dir; sets server_pid, server_port (or server_address).
# Retries with another port when the chosen one was taken in between.
start_server() {
  local config="$1" dir="$tmp/$1-$((++server_seq))"
  mkdir -p "$dir/data"
  server_config="$config"
  server_log="$dir/server.log"
  for attempt in 1 2 3; do
    # jobbroker picks its own ports (port 0); the others get one that is free right now.
    if [[ "$(system_of "$config")" != jobbroker ]]; then
      server_port="$(node "$node_dir/report.js" free-port)"
      server_address="127.0.0.1:$server_port"
    fi
    case "$config" in
      jobbroker|jobbroker-group)
        local durability=DURABILITY_SYNC
        [[ "$config" == jobbroker-group ]] && durability=DURABILITY_GROUP
        printf '{"defaultPolicy": {"durability": "%s", "groupCommitDelay": "0.01s"}}\n' \
          "$durability" >"$dir/config.json"
        # JOBBROKER_ARGS unquoted on purpose: one word per flag.
        # shellcheck disable=SC2086
        "$broker" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$dir/data" \
          --config "$dir/config.json" ${JOBBROKER_ARGS:-} >"$dir/stdout" 2>"$server_log" &
        server_pid=$!
        server_address=""
        # Port 0: the "serving" line is the only way to learn the address (as bench/run.sh).
        for _ in $(seq 1 300); do
          server_address="$(sed -n 's/^jobbroker: serving grpc=\([^ ]*\) .*/\1/p' "$dir/stdout" | head -n 1)"
          [[ -n "$server_address" ]] && return 0
          alive "$server_pid" || break
          sleep 0.1
        done
        ;;
      redis-aof-everysec|redis-aof-always)
        # No RDB snapshots; AOF only, fsynced as the config says; never evict a job.
        redis-server --port "$server_port" --bind 127.0.0.1 --dir "$dir/data" \
          --appendonly yes --appendfsync "${config#redis-aof-}" --save "" \
          --maxmemory-policy noeviction --daemonize no --logfile "" >"$server_log" 2>&1 &
        server_pid=$!
        wait_port "$server_pid" "$server_port" && return 0
        ;;
      beanstalkd-f50|beanstalkd-f0)
        beanstalkd -l 127.0.0.1 -p "$server_port" -b "$dir/data" -f "${config#beanstalkd-f}" \
          >"$server_log" 2>&1 &
        server_pid=$!
        wait_port "$server_pid" "$server_port" && return 0
        ;;
    esac
    echo "$peers_script: $config did not come up (attempt $attempt); its log:" >&2
    tail -n 20 "$server_log" >&2 || true
    stop_server
  done
  return 1
}

# Stops the server by PID: SIGTERM, up to 15 s, then SIGKILL. Sets server_status to its exit
# status. (Not called in $(...): a subshell cannot wait for this shell's child.)
stop_server() {
  server_status=0
  [[ -n "$server_pid" ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 1 150); do
    alive "$server_pid" || break
    sleep 0.1
  done
  if alive "$server_pid"; then
    echo "$peers_script: $server_config (pid $server_pid) ignored SIGTERM for 15 s; killing it" >&2
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  wait "$server_pid" 2>/dev/null || server_status=$?
  server_pid=""
}
