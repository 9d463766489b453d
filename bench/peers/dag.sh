#!/usr/bin/env bash
# bench/peers/dag.sh: a DAG benchmark, 1 -> 1,000 -> 1 fan-out/fan-in, on jobbroker (its own
# TypeScript client) and on BullMQ's FlowProducer (Redis) in the same run on the same machine, and
# jobbroker's jobs/s as a ratio to BullMQ's (the issue's "a DAG benchmark reports jobs/s next to
# BullMQ's FlowProducer").
#
#   bench/peers/dag.sh [--quick] [--only SYSTEMS]
#
# One DAG: a root; 1,000 children that may start only once the root completed; one join that may
# start only once all children completed, and that reads their 1,000 results and checks them (a
# join with fewer fails the run). jobbroker gets the whole graph up front with depends_on
# (node/dag_jobbroker.js); BullMQ gets the root as a plain job and, once it is done, the join
# with its 1,000 children as one flow (node/dag_bullmq.js). README.md ("DAG") has the details.
#
# Systems, each started fresh for every run with its own temp data dir under ${TMPDIR:-/tmp} and
# a free loopback port, stopped by PID (SIGTERM, then SIGKILL after 15 s):
#   jobbroker           fsync before every answer, shared by concurrent callers (its default)
#   redis-aof-always    BullMQ on Redis, AOF fsynced before replies (per event-loop pass)
#   redis-aof-everysec  BullMQ on Redis, AOF fsynced once a second (up to ~1 s of writes lost)
# Variants: seq (DAGS DAGs one after another) and par (PAR_DAGS DAGs, DAGS_PARALLEL at a time).
# Each run: one Node process holds the producer and one worker with CONCURRENCY jobs at once.
#
# Flags and environment:
#   --quick          DAGS=1, PAR_DAGS=4, REPEAT=1: a smoke test (well under a minute)
#   --only SYSTEMS   comma-separated: names above, or bullmq/redis for both Redis settings
#   BUILD_DIR        where jobbroker is built (default ../../build; only server/jobbroker is used)
#   DAGS             DAGs of the seq variant (default 5)
#   PAR_DAGS         DAGs of the par variant (default 8; 0 skips it)
#   DAGS_PARALLEL    DAGs in flight in the par variant (default 4)
#   CHILDREN         children per DAG (default 1000)
#   CONCURRENCY      jobs the worker runs at once, both systems (default 64)
#   PAYLOAD_BYTES    payload of every job (default 100)
#   FANOUT           who adds BullMQ's flow: processor (the root, as its last step; default) or
#                    events (the producer, after QueueEvents says the root completed)
#   REPEAT           runs per cell; the table shows the median (default 3: a run is ~1 s)
#   RESULTS          where the JSON lines go (default bench/peers/results/dag-<timestamp>.jsonl)
#   RUN_TIMEOUT      seconds one run may take before it is cut short (default 120)
#   DAG_FAULT=short  the join waits for one child less: every run must fail (a check of the check)
#   SKIP_INSTALL=1   do not run install.sh (Redis, BullMQ); the TypeScript client is still built
#                    (client/typescript/test.sh --build-only) when its dist/ is missing
#   JOBBROKER_ARGS   extra flags for jobbroker
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=servers.sh
source "$here/servers.sh"
root="$(cd "$here/../.." && pwd)"
node_dir="$here/node"
build_dir="${BUILD_DIR:-$root/build}"
ts_dir="$root/client/typescript"
dags="${DAGS:-5}"
par_dags="${PAR_DAGS:-8}"
dags_parallel="${DAGS_PARALLEL:-4}"
children="${CHILDREN:-1000}"
concurrency="${CONCURRENCY:-64}"
payload_bytes="${PAYLOAD_BYTES:-100}"
fanout="${FANOUT:-processor}"
repeat="${REPEAT:-3}"
run_timeout="${RUN_TIMEOUT:-120}"
fault="${DAG_FAULT:-none}"
only=""
quick=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --only) only="${2:?--only needs a list}"; shift ;;
    --only=*) only="${1#--only=}" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "dag.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ "$quick" -eq 1 ]]; then
  dags="${DAGS:-1}"
  par_dags="${PAR_DAGS:-4}"
  repeat="${REPEAT:-1}"
fi

all_configs=(jobbroker redis-aof-always redis-aof-everysec)
durability_of() {
  case "$1" in
    jobbroker|redis-aof-always) echo "fsync/ack" ;;
    redis-aof-everysec) echo "fsync 1s" ;;
  esac
}
configs=()
for c in "${all_configs[@]}"; do
  if [[ -z "$only" ]]; then configs+=("$c"); continue; fi
  IFS=, read -ra wanted <<<"$only"
  for w in "${wanted[@]}"; do
    if [[ "$w" == "$c" || "$w" == "$(system_of "$c")" || ("$w" == redis && "$c" == redis-*) ]]; then
      configs+=("$c")
      break
    fi
  done
done
if [[ ${#configs[@]} -eq 0 ]]; then
  echo "dag.sh: --only $only matches none of: ${all_configs[*]}" >&2
  exit 2
fi
want_jobbroker=0
want_bullmq=0
for c in "${configs[@]}"; do
  if [[ "$(system_of "$c")" == jobbroker ]]; then want_jobbroker=1; else want_bullmq=1; fi
done

broker="$build_dir/server/jobbroker"
if [[ "$want_jobbroker" -eq 1 && ! -x "$broker" ]]; then
  echo "dag.sh: $broker not built (cmake --build $build_dir --target jobbroker)" >&2
  exit 2
fi
if [[ "$want_bullmq" -eq 1 && "${SKIP_INSTALL:-0}" != 1 ]]; then
  "$here/install.sh"
fi
# The TypeScript client, as bench/workers/run.sh gets it: npm ci from its lock file and a build.
if [[ "$want_jobbroker" -eq 1 ]] &&
   ! [[ -f "$ts_dir/dist/src/index.js" && -d "$ts_dir/node_modules/@grpc/grpc-js" ]]; then
  echo "+ client/typescript/test.sh --build-only" >&2
  JOBBROKER_BIN="$broker" "$ts_dir/test.sh" --build-only >&2
fi

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
results="${RESULTS:-$here/results/dag-$stamp.jsonl}"
mkdir -p "$(dirname "$results")"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-dag.XXXXXX")"
# One copy of the broker for the whole run: a rebuild of build/ meanwhile changes nothing here.
if [[ "$want_jobbroker" -eq 1 ]]; then
  cp "$broker" "$tmp/jobbroker"
  broker="$tmp/jobbroker"
fi

# One run of `variant` (seq, par) against a fresh server of `config`; appends its tagged line.
failures=0
run_one() {
  local config="$1" variant="$2" n="$3" p="$4" system status=0 line cpu0 cpu1 load0 load1
  local out="$tmp/load.out" err="$tmp/load.err" cmd
  system="$(system_of "$config")"
  if ! start_server "$config"; then
    echo "dag.sh: could not start $config; skipping its $variant run" >&2
    failures=$((failures + 1))
    return 0
  fi
  cmd=(--config "$config" --dags "$n" --parallel "$p" --children "$children"
    --concurrency "$concurrency" --payload-bytes "$payload_bytes" --timeout "$run_timeout"
    --fault "$fault")
  if [[ "$system" == jobbroker ]]; then
    cmd=(node "$node_dir/dag_jobbroker.js" --address "$server_address" "${cmd[@]}")
  else
    cmd=(node "$node_dir/dag_bullmq.js" --port "${server_address##*:}" --fanout "$fanout" "${cmd[@]}")
  fi
  echo "+ [$config] ${cmd[*]}" >&2
  cpu0="$(cpu_seconds "$server_pid")"
  load0="$(children_cpu_seconds)"
  timeout -k 5 "$((run_timeout + 30))" "${cmd[@]}" >"$out" 2>"$err" || status=$?
  load1="$(children_cpu_seconds)"
  cpu1="$(cpu_seconds "$server_pid")"
  stop_server
  if [[ "$server_status" -ne 0 ]]; then
    echo "dag.sh: $config exited with status $server_status after SIGTERM; its log:" >&2
    tail -n 20 "$server_log" >&2 || true
    failures=$((failures + 1))
  fi
  sed 's/^/    /' "$err" >&2
  line="$(grep '^{' "$out" | tail -n 1 || true)"
  if [[ -z "$line" ]]; then
    echo "dag.sh: [$config] $variant printed no result (exit $status)" >&2
    failures=$((failures + 1))
    return 0
  fi
  if [[ "$status" -ne 0 ]]; then
    echo "dag.sh: [$config] $variant failed (exit $status)" >&2
    failures=$((failures + 1))
  fi
  printf '%s\n' "$line" |
    node "$node_dir/report.js" tag run="$stamp" repeat="$rep" workload="dag-$variant" \
      system="$system" config="$config" durability="$(durability_of "$config")" \
      server_cpu_s="$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.3f", b - a }')" \
      load_cpu_s="$(awk -v a="$load0" -v b="$load1" 'BEGIN { printf "%.3f", b - a }')" \
      server_exit="$server_status" load_exit="$status" >>"$results"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
{
  printf '{"kind":"meta","run":"%s","bench":"dag","quick":%s,"dags":%d,"par_dags":%d,' \
    "$stamp" "$([[ $quick -eq 1 ]] && echo true || echo false)" "$dags" "$par_dags"
  printf '"dags_parallel":%d,"children":%d,"concurrency":%d,"payload_bytes":%d,"fanout":"%s",' \
    "$dags_parallel" "$children" "$concurrency" "$payload_bytes" "$fanout"
  printf '"repeat":%d,"fault":"%s","node":"%s",' "$repeat" "$fault" "$(node --version)"
  if [[ "$want_bullmq" -eq 1 ]]; then
    printf '"redis":"%s","bullmq":"%s",' "$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')" \
      "$(node -p "require('$node_dir/node_modules/bullmq/package.json').version")"
  fi
  printf '"jobbroker_commit":"%s","cpus":%d,"tmpdir":"%s","loadavg_start":"%s"}\n' \
    "$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$(nproc)" \
    "${TMPDIR:-/tmp}" "$(loadavg)"
} >>"$results"

started=$SECONDS
variants=("seq $dags 1")
[[ "$par_dags" -gt 0 ]] && variants+=("par $par_dags $dags_parallel")
for ((rep = 1; rep <= repeat; rep++)); do
  for v in "${variants[@]}"; do
    read -r variant n p <<<"$v"
    for config in "${configs[@]}"; do
      run_one "$config" "$variant" "$n" "$p"
    done
  done
done
printf '{"kind":"meta_end","run":"%s","seconds":%d,"loadavg_end":"%s"}\n' \
  "$stamp" "$((SECONDS - started))" "$(loadavg)" >>"$results"

# The table: per variant and system, the median over REPEAT of each figure (usable runs only:
# every DAG done, every check passed); then jobbroker's jobs/s over each peer's, and each peer's
# root-to-join latency over jobbroker's (above 1x, jobbroker did better).
node - "$results" <<'EOF'
const fs = require('node:fs');
const lines = fs.readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const meta = lines.find((l) => l.kind === 'meta');
const metaEnd = lines.find((l) => l.kind === 'meta_end') || {};
const runs = lines.filter((l) => l.mode === 'dag');
const median = (xs) => {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return null;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const usable = (l) => l.errors === 0 && !l.timed_out && l.load_exit === 0 && l.done === l.jobs;
const cells = new Map();
for (const l of runs) {
  const key = `${l.workload}|${l.config}`;
  if (!cells.has(key)) cells.set(key, []);
  cells.get(key).push(l);
}
const fmt = (x, d = 0) => (x === null || x === undefined ? 'n/a' : x.toFixed(d));
const pad = (s, n) => String(s).padEnd(n);
const lpad = (s, n) => String(s).padStart(n);
console.log(`\nDAG 1 -> ${meta.children} -> 1, ${meta.concurrency} jobs at once, payload ${meta.payload_bytes} B; ` +
  `${meta.cpus} cpus, load average ${meta.loadavg_start} at the start, ${metaEnd.loadavg_end || '?'} at the end`);
console.log(`${pad('variant', 14)}${pad('config', 20)}${pad('durability', 11)}${lpad('DAGs', 5)}${lpad('jobs', 7)}` +
  `${lpad('seconds', 9)}${lpad('jobs/s', 9)}${lpad('root->join p50 ms', 19)}${lpad('DAG p50 ms', 12)}${lpad('client cpu s', 14)}  notes`);
const rows = [];
for (const [key, ls] of cells) {
  const [workload, config] = key.split('|');
  const ok = ls.filter(usable);
  const pick = (k) => median(ok.map((l) => l[k]));
  const row = { workload, config, durability: ls[0].durability, jobsPerSec: pick('jobs_per_sec'), rootToJoin: pick('root_to_join_p50_ms') };
  rows.push(row);
  const notes = [];
  if (ok.length < ls.length) notes.push(`${ls.length - ok.length} of ${ls.length} run(s) failed: ${ls.find((l) => !usable(l)).first_error || 'see above'}`);
  const variant = `${workload.replace('dag-', '')} x${ls[0].parallel}`;
  console.log(`${pad(variant, 14)}${pad(config, 20)}${pad(row.durability, 11)}${lpad(ls[0].dags, 5)}${lpad(ls[0].jobs, 7)}` +
    `${lpad(fmt(pick('seconds'), 2), 9)}${lpad(fmt(row.jobsPerSec), 9)}${lpad(fmt(row.rootToJoin, 1), 19)}` +
    `${lpad(fmt(pick('dag_p50_ms'), 1), 12)}${lpad(fmt(pick('client_cpu_s'), 2), 14)}  ${notes.join('; ')}`);
}
console.log('\nratios (jobbroker jobs/s / peer jobs/s; peer root->join p50 / jobbroker\'s: above 1x, jobbroker did better)');
for (const r of rows.filter((x) => x.config !== 'jobbroker')) {
  const jb = rows.find((x) => x.config === 'jobbroker' && x.workload === r.workload);
  if (!jb) continue;
  const ratio = (a, b) => (a && b ? `${(a / b).toFixed(2)}x` : 'n/a');
  console.log(`${pad(r.workload.replace('dag-', ''), 14)}jobbroker vs ${pad(r.config, 20)} jobs/s ${lpad(ratio(jb.jobsPerSec, r.jobsPerSec), 7)}` +
    `   root->join ${lpad(ratio(r.rootToJoin, jb.rootToJoin), 7)}`);
}
EOF
echo
echo "results: $results ($((SECONDS - started)) s)"
if [[ "$failures" -gt 0 ]]; then
  echo "dag.sh: $failures run(s) failed or were cut short; see above" >&2
  exit 1
fi
