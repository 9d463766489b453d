# Sourced by the bench scripts: start a server of ours (jobbroker, jobbroker-echo-server) on
# port 0 and learn its address, and stop it by PID. Each server prints "<prefix>HOST:PORT ..." on
# stdout once it serves; with port 0 that line is the only way to learn the port.

# serve_start NAME PREFIX DIR CMD...: runs CMD in the background, stdout and stderr to
# DIR/NAME.stdout and DIR/NAME.stderr, and waits up to SERVE_TIMEOUT seconds (default 30) for its
# serving line. Sets started_pid and started_address. On failure prints its stderr and returns 1
# (the process is killed if it still runs).
serve_start() {
  local name="$1" prefix="$2" dir="$3"
  shift 3
  # Emptied here, not by the redirection below: that one runs in the child, and a restart in the
  # same DIR could otherwise read the last run's serving line before the child truncates it.
  : >"$dir/$name.stdout"
  "$@" >"$dir/$name.stdout" 2>"$dir/$name.stderr" &
  started_pid=$!
  started_address=""
  local deadline=$((SECONDS + ${SERVE_TIMEOUT:-30}))
  while ((SECONDS < deadline)); do
    started_address="$(sed -n "s/^$prefix\([^ ]*\).*/\1/p" "$dir/$name.stdout" | head -n 1)"
    [[ -n "$started_address" ]] && return 0
    if ! kill -0 "$started_pid" 2>/dev/null; then
      echo "$name exited before serving; stderr:" >&2
      cat "$dir/$name.stderr" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "$name did not print its serving line within ${SERVE_TIMEOUT:-30} s; stderr:" >&2
  cat "$dir/$name.stderr" >&2
  kill -KILL "$started_pid" 2>/dev/null || true
  wait "$started_pid" 2>/dev/null || true
  return 1
}

# serve_stop PID: SIGTERM, up to 30 s to exit (a broker with millions of jobs flushes a while),
# then SIGKILL. Sets stopped_status to its exit status. Call it from the shell that started the
# server (only that shell can wait for it), not in a subshell.
serve_stop() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "pid $pid still running 30 s after SIGTERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  stopped_status=0
  wait "$pid" 2>/dev/null || stopped_status=$?
}

# The broker's serving line starts with this.
broker_prefix="jobbroker: serving grpc="

# serve_broker BROKER DIR [flags...]: serve_start for a jobbroker on free loopback ports with its
# data in DIR/data (logs DIR/broker.stdout, DIR/broker.stderr) and any extra flags. Sets
# broker_pid, broker_address (gRPC) and broker_http (HOST:PORT of /metrics and /healthz).
serve_broker() {
  local broker="$1" dir="$2"
  shift 2
  serve_start broker "$broker_prefix" "$dir" "$broker" --listen 127.0.0.1:0 \
    --http-listen 127.0.0.1:0 --data-dir "$dir/data" "$@" || return 1
  broker_pid="$started_pid"
  broker_address="$started_address"
  broker_http="$(sed -n "s/^$broker_prefix[^ ]* http=\([^ ]*\).*/\1/p" "$dir/broker.stdout" | head -n 1)"
}

# stop_broker DIR: serve_stop for the broker serve_broker started (logs in DIR); reports its exit
# status and, if not 0, the end of its stderr. Returns 1 then; clears broker_pid.
stop_broker() {
  serve_stop "$broker_pid"
  broker_pid=""
  echo "broker exited with status $stopped_status after SIGTERM" >&2
  if [[ "$stopped_status" -ne 0 ]]; then
    echo "broker stderr:" >&2
    tail -n 50 "$1/broker.stderr" >&2
    return 1
  fi
}
