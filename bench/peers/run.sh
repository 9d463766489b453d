#!/usr/bin/env bash
# bench/peers/run.sh: jobbroker against BullMQ on Redis and against beanstalkd, the same
# workloads in the same run, and each figure as a ratio to jobbroker.
#
#   bench/peers/run.sh [--quick] [--only SYSTEMS]
#
# Systems (server configurations), each started fresh for every run with its own temp data dir
# under ${TMPDIR:-/tmp} and a free loopback port, stopped by PID:
#   jobbroker           fsync before every answer, shared by concurrent callers (group commit)
#   jobbroker-group     DURABILITY_GROUP: answer once in the log, fsync within 10 ms (a killed
#                       process loses nothing; power loss up to 10 ms of answers)
#   redis-aof-everysec  BullMQ on Redis, AOF fsynced once a second (up to ~1 s of writes lost)
#   redis-aof-always    BullMQ on Redis, AOF fsynced before replies (per event-loop pass)
#   beanstalkd-f50      binlog fsynced at most every 50 ms (beanstalkd's default)
#   beanstalkd-f0       binlog fsynced on every write
# Workloads (see README.md for their definitions): enqueue, batch, e2e and drain (several
# consumer settings; the best one counts), producer (jobbroker's TypeScript and Python client
# helpers; the peers' counterpart is their enqueue), latency.
#
# Flags and environment:
#   --quick          JOBS=3000, F0_JOBS=1000 and one consumer setting for e2e: a smoke test
#   --only SYSTEMS   comma-separated: names above, or bullmq/redis/beanstalkd for a family
#   --workloads LIST comma-separated, in this order by default: enqueue,batch,e2e,drain,producer,latency
#   BUILD_DIR        where jobbroker and jobbroker-bench are built (default ../../build)
#   JOBS             jobs per run (default 50000)
#   F0_JOBS          jobs per run for beanstalkd-f0, which fsyncs each write (default 5000)
#   REPEAT           runs per cell; the table shows the median (default 1)
#   RESULTS          where the JSON lines go (default bench/peers/results/<timestamp>.jsonl)
#   RUN_TIMEOUT      seconds one load run may take before it is cut short (default 180)
#   SKIP_INSTALL=1   do not run install.sh
#   JOBBROKER_ARGS   extra flags for the jobbroker configurations (e.g. "--partitions 4")
# Only one server runs at a time; the systems take turns workload by workload.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=servers.sh
source "$here/servers.sh"
node_dir="$here/node"
build_dir="${BUILD_DIR:-$here/../../build}"
jobs="${JOBS:-50000}"
f0_jobs="${F0_JOBS:-5000}"
repeat="${REPEAT:-1}"
run_timeout="${RUN_TIMEOUT:-180}"
only=""
quick=0
workloads_flag="enqueue,batch,e2e,drain,producer,latency"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --only) only="${2:?--only needs a list}"; shift ;;
    --only=*) only="${1#--only=}" ;;
    --workloads) workloads_flag="${2:?--workloads needs a list}"; shift ;;
    --workloads=*) workloads_flag="${1#--workloads=}" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ "$quick" -eq 1 ]]; then
  jobs="${JOBS:-3000}"
  f0_jobs="${F0_JOBS:-1000}"
fi

# ---- The load commands, in one place -------------------------------------------------------
# jobbroker-bench: --address, --jobs and --timeout are added to each.
jb_enqueue=(enqueue --concurrency 64 --payload-bytes 100)
jb_batch=(batch --concurrency 4 --batch 100 --payload-bytes 100)
jb_e2e=(stream --concurrency 4 --producer-batch 100 --payload-bytes 100)  # + --workers --in-flight
jb_e2e_settings=("1 64" "2 64" "4 64" "4 256" "8 256")                     # "workers in-flight"
jb_drain=(drain --concurrency 4 --producer-batch 100 --payload-bytes 100)   # + --workers --in-flight
jb_drain_settings=("1 256" "4 64" "4 256")                                 # "workers in-flight"
# producer: the client helpers as users call them, 64 concurrent enqueue() of one job each (their
# default coalescing; "calls": TypeScript's batches as EnqueueBatch calls instead of messages of
# one EnqueueStream; "unary": coalescing off; "uvloop": the Python helper on uvloop's event loop,
# as under uvicorn). The peers' counterpart is their enqueue workload.
jb_producer_settings=(typescript typescript-calls typescript-unary python python-uvloop python-unary)
latency_rate=1000
latency_jobs=3000
jb_latency=(latency --rate "$latency_rate" --in-flight 16 --payload-bytes 100)
# node/load.js for BullMQ and beanstalkd: --system, --port, --config, --jobs, --timeout added.
peer_enqueue=(--mode enqueue --concurrency 64 --payload-bytes 100)
peer_batch=(--mode batch --concurrency 4 --batch 100 --payload-bytes 100)
peer_e2e_bullmq=(--mode e2e --batch 100 --producer-in-flight 4 --payload-bytes 100)  # + --concurrency
peer_e2e_beanstalkd=(--mode e2e --producer-in-flight 64 --payload-bytes 100)         # no batch put
peer_e2e_settings=(8 32 128)                                                          # consumer C
peer_drain_bullmq=(--mode drain --batch 100 --producer-in-flight 4 --payload-bytes 100)  # + --concurrency
peer_drain_beanstalkd=(--mode drain --producer-in-flight 64 --payload-bytes 100)
peer_drain_settings=(8 32 128)
peer_latency=(--mode latency --rate "$latency_rate" --concurrency 16 --payload-bytes 100)
if [[ "$quick" -eq 1 ]]; then
  jb_e2e_settings=("2 64")
  peer_e2e_settings=(32)
  jb_drain_settings=("1 256")
  peer_drain_settings=(32)
  jb_producer_settings=(typescript python)
fi
# ---------------------------------------------------------------------------------------------

all_configs=(jobbroker jobbroker-group redis-aof-everysec redis-aof-always beanstalkd-f50
  beanstalkd-f0)
durability_of() {
  case "$1" in
    jobbroker) echo "fsync/ack" ;;
    jobbroker-group) echo "fsync 10ms" ;;
    redis-aof-always) echo "fsync/ack" ;;
    redis-aof-everysec) echo "fsync 1s" ;;
    beanstalkd-f50) echo "fsync 50ms" ;;
    beanstalkd-f0) echo "fsync/write" ;;
  esac
}
configs=()
for c in "${all_configs[@]}"; do
  if [[ -z "$only" ]]; then
    configs+=("$c")
    continue
  fi
  IFS=, read -ra wanted <<<"$only"
  for w in "${wanted[@]}"; do
    if [[ "$w" == "$c" || "$w" == "$(system_of "$c")" || ("$w" == redis && "$c" == redis-*) ]]; then
      configs+=("$c")
      break
    fi
  done
done
if [[ ${#configs[@]} -eq 0 ]]; then
  echo "run.sh: --only $only matches none of: ${all_configs[*]}" >&2
  exit 2
fi

broker="$build_dir/server/jobbroker"
bench="$build_dir/bench/jobbroker-bench"
for c in "${configs[@]}"; do
  if [[ "$(system_of "$c")" == jobbroker ]]; then
    for f in "$broker" "$bench"; do
      if [[ ! -x "$f" ]]; then
        echo "run.sh: $f not built (cmake --build $build_dir --target jobbroker jobbroker-bench)" >&2
        exit 2
      fi
    done
  fi
done

IFS=, read -ra workloads <<<"$workloads_flag"
for w in "${workloads[@]}"; do
  case "$w" in
    enqueue | batch | e2e | drain | producer | latency) ;;
    *) echo "run.sh: unknown workload $w (enqueue, batch, e2e, drain, producer, latency)" >&2; exit 2 ;;
  esac
done

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  "$here/install.sh"
fi
# The producer workload runs the TypeScript and Python client helpers: built (from their lock
# files) before any timing.
if [[ ",$workloads_flag," == *,producer,* && " ${configs[*]} " == *" jobbroker"* ]]; then
  echo "+ client/typescript/test.sh --build-only; client/python/test.sh --build-only" >&2
  JOBBROKER_BIN="$broker" "$root/client/typescript/test.sh" --build-only >&2
  JOBBROKER_BIN="$broker" "$root/client/python/test.sh" --build-only >&2
fi

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
results="${RESULTS:-$here/results/$stamp.jsonl}"
mkdir -p "$(dirname "$results")"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-peers.XXXXXX")"
# Sets `cmd` to the load command of `workload` for the running server of `config`.
# $3: jobs; $4: the e2e consumer setting.
set_cmd() {
  local config="$1" workload="$2" jobs="$3" setting="${4:-}" system w k
  system="$(system_of "$config")"
  if [[ "$system" == jobbroker ]]; then
    cmd=("$bench" --address "$server_address" --jobs "$jobs" --timeout "$run_timeout")
    case "$workload" in
      enqueue) cmd+=("${jb_enqueue[@]}") ;;
      batch) cmd+=("${jb_batch[@]}") ;;
      e2e) read -r w k <<<"$setting"; cmd+=("${jb_e2e[@]}" --workers "$w" --in-flight "$k") ;;
      drain) read -r w k <<<"$setting"; cmd+=("${jb_drain[@]}" --workers "$w" --in-flight "$k") ;;
      latency) cmd+=("${jb_latency[@]}") ;;
      producer)
        case "$setting" in
          typescript*) cmd=(node "$here/clients/producer.mjs") ;;
          python*) cmd=("$root/client/python/.venv/bin/python" "$here/clients/producer.py") ;;
        esac
        cmd+=(--address "$server_address" --jobs "$jobs" --concurrency 64 --payload-bytes 100
          --timeout "$run_timeout")
        if [[ "$setting" == *-unary ]]; then cmd+=(--no-batching); fi
        if [[ "$setting" == *-calls ]]; then cmd+=(--no-batch-stream); fi
        if [[ "$setting" == *-uvloop ]]; then cmd+=(--loop uvloop); fi
        ;;
    esac
    return
  fi
  cmd=(node "$node_dir/load.js" --system "$system" --config "$config" --port "$server_port"
    --jobs "$jobs" --timeout "$run_timeout")
  case "$workload" in
    enqueue) cmd+=("${peer_enqueue[@]}") ;;
    batch) cmd+=("${peer_batch[@]}") ;;
    e2e)
      if [[ "$system" == bullmq ]]; then
        cmd+=("${peer_e2e_bullmq[@]}" --concurrency "$setting")
      else
        cmd+=("${peer_e2e_beanstalkd[@]}" --concurrency "$setting")
      fi
      ;;
    drain)
      if [[ "$system" == bullmq ]]; then
        cmd+=("${peer_drain_bullmq[@]}" --concurrency "$setting")
      else
        cmd+=("${peer_drain_beanstalkd[@]}" --concurrency "$setting")
      fi
      ;;
    latency) cmd+=("${peer_latency[@]}") ;;
  esac
}

# An older jobbroker-bench may lack a mode or flag the lead is adding (batch, --producer-batch):
# drop --producer-batch and retry; for a missing mode, report the cell as unsupported (n/a).
without_producer_batch() {
  local out=() skip=0
  for a in "${cmd[@]}"; do
    if [[ "$skip" -eq 1 ]]; then skip=0; continue; fi
    if [[ "$a" == --producer-batch ]]; then skip=1; continue; fi
    out+=("$a")
  done
  cmd=("${out[@]}")
}

# Runs one load against a fresh server of `config` and appends its tagged JSON line to the
# results file. $3: jobs; $4: the e2e consumer setting.
failures=0
run_one() {
  local config="$1" workload="$2" jobs="$3" setting="${4:-}"
  local system out err line cpu0 cpu1 load0 load1 status exit_status expected
  system="$(system_of "$config")"
  out="$tmp/load.out"
  err="$tmp/load.err"
  if [[ "$system" == beanstalkd && "$workload" == batch ]]; then
    # beanstalkd has no batch put: a null figure, shown as n/a, and no server to start.
    printf '{"mode":"batch","jobs":%d,"done":0,"jobs_per_sec":null,"unsupported":true}\n' "$jobs" |
      node "$node_dir/report.js" tag run="$stamp" repeat="$rep" workload=batch system="$system" \
        config="$config" durability="$(durability_of "$config")" >>"$results"
    return 0
  fi
  if ! start_server "$config"; then
    echo "run.sh: could not start $config; skipping its $workload run" >&2
    failures=$((failures + 1))
    return 0
  fi
  set_cmd "$config" "$workload" "$jobs" "$setting"
  cpu0="$(cpu_seconds "$server_pid")"
  load0="$(children_cpu_seconds)"
  echo "+ [$config] ${cmd[*]}" >&2
  status=0
  timeout -k 5 "$((run_timeout + 30))" "${cmd[@]}" >"$out" 2>"$err" || status=$?
  if [[ "$system" == jobbroker && "$status" -eq 2 ]] && grep -q 'unknown flag: --producer-batch' "$err"; then
    echo "run.sh: this jobbroker-bench has no --producer-batch; running e2e without it" >&2
    without_producer_batch
    status=0
    timeout -k 5 "$((run_timeout + 30))" "${cmd[@]}" >"$out" 2>"$err" || status=$?
  fi
  if [[ "$system" == jobbroker && "$status" -eq 2 ]] && grep -q '^mode must be' "$err"; then
    echo "run.sh: this jobbroker-bench has no $workload mode; reported as n/a" >&2
    printf '{"mode":"%s","jobs":%d,"done":0,"jobs_per_sec":null,"unsupported":true}\n' \
      "$workload" "$jobs" >"$out"
    status=0
  fi
  load1="$(children_cpu_seconds)"
  cpu1="$(cpu_seconds "$server_pid")"
  stop_server
  exit_status="$server_status"
  # beanstalkd has no SIGTERM handler and dies of the signal (status 143), as intended.
  expected=0
  [[ "$system" == beanstalkd ]] && expected=143
  if [[ "$exit_status" -ne "$expected" ]]; then
    echo "run.sh: $config exited with status $exit_status after SIGTERM; its log:" >&2
    tail -n 20 "$server_log" >&2 || true
    failures=$((failures + 1))
  fi
  line="$(grep '^{' "$out" | tail -n 1 || true)"
  if [[ -z "$line" ]]; then
    echo "run.sh: [$config] $workload printed no result (exit $status); stderr:" >&2
    tail -n 20 "$err" >&2
    failures=$((failures + 1))
    return 0
  fi
  if [[ "$status" -ne 0 ]]; then
    echo "run.sh: [$config] $workload exited $status; stderr:" >&2
    tail -n 5 "$err" | sed 's/^/    /' >&2
    failures=$((failures + 1))
  else
    # The human lines: jobbroker-bench's on stdout, load.js's on stderr.
    { grep -v '^{' "$out" || true; grep -E '^(latency from|[a-z0-9-]+ [a-z0-9]+ concurrency=)' "$err" || true; } |
      sed 's/^/    /' >&2
  fi
  local extra=()
  [[ "$workload" == latency ]] && extra+=(rate="$latency_rate")
  if [[ -n "$setting" ]]; then extra+=(setting="$setting"); fi
  printf '%s\n' "$line" |
    node "$node_dir/report.js" tag run="$stamp" repeat="$rep" workload="$workload" \
      system="$system" config="$config" durability="$(durability_of "$config")" \
      server_cpu_s="$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.3f", b - a }')" \
      load_cpu_s="$(awk -v a="$load0" -v b="$load1" 'BEGIN { printf "%.3f", b - a }')" \
      server_exit="$exit_status" load_exit="$status" "${extra[@]}" >>"$results"
}

jobs_for() {
  if [[ "$1" == beanstalkd-f0 && "$f0_jobs" -lt "$2" ]]; then echo "$f0_jobs"; else echo "$2"; fi
}

# Versions, so a results file says what it measured.
{
  printf '{"kind":"meta","run":"%s","jobs":%d,"f0_jobs":%d,"repeat":%d,"quick":%s,' \
    "$stamp" "$jobs" "$f0_jobs" "$repeat" "$([[ $quick -eq 1 ]] && echo true || echo false)"
  printf '"redis":"%s","beanstalkd":"%s","node":"%s","bullmq":"%s","ioredis":"%s",' \
    "$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')" \
    "$(beanstalkd -v | awk '{print $2}')" "$(node --version)" \
    "$(node -p "require('$node_dir/node_modules/bullmq/package.json').version")" \
    "$(node -p "require('$node_dir/node_modules/ioredis/package.json').version")"
  printf '"jobbroker_commit":"%s","cpus":%d,"tmpdir":"%s"}\n' \
    "$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$(nproc)" "${TMPDIR:-/tmp}"
} >>"$results"

started=$SECONDS
for ((rep = 1; rep <= repeat; rep++)); do
  for workload in "${workloads[@]}"; do
    for config in "${configs[@]}"; do
      system="$(system_of "$config")"
      n="$jobs"
      [[ "$workload" == latency ]] && n="$latency_jobs"
      n="$(jobs_for "$config" "$n")"
      if [[ "$workload" == producer ]]; then
        # The peers' counterpart is their enqueue workload, already run.
        [[ "$system" == jobbroker ]] || continue
        for s in "${jb_producer_settings[@]}"; do run_one "$config" producer "$n" "$s"; done
      elif [[ "$workload" == e2e || "$workload" == drain ]]; then
        local_settings=()
        if [[ "$system" == jobbroker && "$workload" == e2e ]]; then
          local_settings=("${jb_e2e_settings[@]}")
        elif [[ "$system" == jobbroker ]]; then
          local_settings=("${jb_drain_settings[@]}")
        elif [[ "$workload" == e2e ]]; then
          local_settings=("${peer_e2e_settings[@]}")
        else
          local_settings=("${peer_drain_settings[@]}")
        fi
        for s in "${local_settings[@]}"; do run_one "$config" "$workload" "$n" "$s"; done
      else
        run_one "$config" "$workload" "$n"
      fi
    done
  done
done

node "$node_dir/report.js" table "$results"
echo
echo "results: $results ($((SECONDS - started)) s)"
if [[ "$failures" -gt 0 ]]; then
  echo "run.sh: $failures run(s) failed or were cut short; see above" >&2
  exit 1
fi
