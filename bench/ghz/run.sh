#!/usr/bin/env bash
# Unary Enqueue against a plain gRPC echo, measured by two tools: ghz (an outside load generator,
# pinned by install.sh) and our own jobbroker-bench, so our tool is not the only judge of our
# speed. Starts a fresh broker and a fresh jobbroker-echo-server (bench/echo/) on free loopback
# ports, then for each tool runs Echo and right after it Enqueue (a fresh queue per run) with
# the same settings: CONCURRENCY calls in flight over CONNECTIONS connections, JOBS calls of a
# PAYLOAD_BYTES payload. Prints a table of rps, p50 and p99, and enqueue/echo per tool.
# Runs pair by tool so each ratio compares two runs made under the same background load.
#
# Environment: BUILD_DIR (default: build/ at the repo root; needs jobbroker, jobbroker-bench and
# jobbroker-echo-server built), JOBS (50000), CONCURRENCY (64), CONNECTIONS (4, both tools),
# PAYLOAD_BYTES (100), RESULTS (a file to append the table's rows to as JSON lines),
# TMPDIR (where the broker's data dir goes: put it on the disk you measure).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
broker="$build_dir/server/jobbroker"
echo_server="$build_dir/bench/echo/jobbroker-echo-server"
bench="$build_dir/bench/jobbroker-bench"
jobs="${JOBS:-50000}"
concurrency="${CONCURRENCY:-64}"
connections="${CONNECTIONS:-4}"
payload_bytes="${PAYLOAD_BYTES:-100}"
run_timeout=300  # seconds any one load run may take

for f in "$broker" "$echo_server" "$bench"; do
  if [[ ! -x "$f" ]]; then
    echo "ghz/run.sh: $f not built (cmake --build $build_dir --target jobbroker" \
      "jobbroker-bench jobbroker-echo-server)" >&2
    exit 2
  fi
done
"$here/install.sh"
ghz="$here/bin/ghz"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-ghz.XXXXXX")"
broker_pid=""
echo_pid=""
# shellcheck source=../lib/serve.sh
source "$here/../lib/serve.sh"
cleanup() {
  if [[ -n "$broker_pid" ]]; then serve_stop "$broker_pid"; fi
  if [[ -n "$echo_pid" ]]; then serve_stop "$echo_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

serve_broker "$broker" "$tmp" || exit 1
serve_start echo "echo: serving grpc=" "$tmp" "$echo_server" --listen 127.0.0.1:0 || exit 1
echo_pid="$started_pid"
echo_address="$started_address"
echo "broker pid $broker_pid at $broker_address (data in $tmp/data)," \
  "echo server pid $echo_pid at $echo_address" >&2

# bytes fields are base64 in ghz's JSON call data; the same bytes jobbroker-bench sends ('p').
payload_b64="$(head -c "$payload_bytes" /dev/zero | tr '\0' p | base64 -w 0)"

# run_ghz TARGET: ghz's JSON report in $tmp/ghz-TARGET.json. The services are described by our
# own .proto files, not by server reflection, so what is called is exactly the source's
# contract. -t matches jobbroker-bench's 30 s per-call deadline. The whole run is bounded by
# timeout(1), not by ghz's -x: in v0.120.0 -x turns into -z and -n is then ignored (the run
# goes on for the full -x, sending millions of calls), whatever its help text says.
run_ghz() {
  local target="$1" call proto import address data
  if [[ "$target" == echo ]]; then
    call=jobbroker.bench.v1.Echo/Echo
    proto="$repo/bench/echo/jobbroker/bench/v1/echo.proto"
    import="$repo/bench/echo"
    address="$echo_address"
    data="{\"payload\":\"$payload_b64\"}"
  else
    call=jobbroker.v1.Broker/Enqueue
    proto="$repo/proto/jobbroker/v1/broker.proto"
    import="$repo/proto"
    address="$broker_address"
    data="{\"queue\":\"ghz-enqueue-$$-$(date +%s%N)\",\"payload\":\"$payload_b64\"}"
  fi
  echo "+ ghz $call -c $concurrency -n $jobs --connections $connections" >&2
  timeout "$run_timeout" "$ghz" --insecure --proto "$proto" -i "$import" --call "$call" \
    -d "$data" -c "$concurrency" -n "$jobs" --connections "$connections" -t 30s \
    -O json -o "$tmp/ghz-$target.json" "$address"
}

# run_bench TARGET: jobbroker-bench's JSON line in $tmp/bench-TARGET.json.
run_bench() {
  local target="$1" mode address
  if [[ "$target" == echo ]]; then
    mode=echo address="$echo_address"
  else
    mode=enqueue address="$broker_address"
  fi
  echo "+ jobbroker-bench $mode --concurrency $concurrency --jobs $jobs --channels $connections" >&2
  timeout $((run_timeout + 60)) "$bench" "$mode" --address "$address" \
    --concurrency "$concurrency" --jobs "$jobs" --channels "$connections" \
    --payload-bytes "$payload_bytes" --timeout "$run_timeout" >"$tmp/bench-$target.out"
  grep '^{' "$tmp/bench-$target.out" >"$tmp/bench-$target.json"
}

status=0
run_ghz echo || status=1
run_ghz enqueue || status=1
run_bench echo || status=1
run_bench enqueue || status=1

# One row per run, then the ratios. A run with errors or missing calls is flagged, not hidden.
python3 - "$tmp" "$jobs" "${RESULTS:-}" <<'PY' || status=1
import json, os, sys

tmp, jobs, results = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
ok = True
for tool in ("ghz", "jobbroker-bench"):
    for target in ("echo", "enqueue"):
        path = os.path.join(tmp, f"{'ghz' if tool == 'ghz' else 'bench'}-{target}.json")
        row = {"tool": tool, "target": target, "rps": 0.0, "p50_ms": 0.0, "p99_ms": 0.0,
               "done": 0, "errors": 0}
        try:
            with open(path) as f:
                r = json.loads(f.readline() if tool != "ghz" else f.read())
        except (OSError, ValueError) as e:
            print(f"ghz/run.sh: no result for {tool} {target}: {e}", file=sys.stderr)
            row["errors"] = -1
            rows.append(row)
            ok = False
            continue
        if tool == "ghz":
            # Latencies are nanoseconds; rps counts every call, so take OKs from the codes.
            pct = {int(p["percentage"]): p["latency"] / 1e6
                   for p in r.get("latencyDistribution") or []}
            codes = r.get("statusCodeDistribution") or {}
            row.update(rps=r.get("rps", 0.0), p50_ms=pct.get(50, 0.0), p99_ms=pct.get(99, 0.0),
                       done=codes.get("OK", 0),
                       errors=sum(n for c, n in codes.items() if c != "OK"))
            if row["errors"]:
                print(f"ghz/run.sh: ghz {target} errors: {r.get('errorDistribution')}",
                      file=sys.stderr)
        else:
            row.update(rps=r["jobs_per_sec"], p50_ms=r["p50_ms"], p99_ms=r["p99_ms"],
                       done=r["done"], errors=r["errors"])
        ok = ok and row["errors"] == 0 and row["done"] == jobs
        rows.append(row)

print(f"{'tool':<16} {'target':<8} {'rps':>9} {'p50_ms':>8} {'p99_ms':>8} {'done':>7} "
      f"{'errors':>6}")
for r in rows:
    print(f"{r['tool']:<16} {r['target']:<8} {r['rps']:>9.0f} {r['p50_ms']:>8.2f} "
          f"{r['p99_ms']:>8.2f} {r['done']:>7} {r['errors']:>6}")
for tool in ("ghz", "jobbroker-bench"):
    by = {r["target"]: r for r in rows if r["tool"] == tool}
    echo, enq = by["echo"], by["enqueue"]
    ratio = enq["rps"] / echo["rps"] if echo["rps"] else 0.0
    print(f"{tool}: enqueue/echo rps = {ratio:.2f}"
          f" (p50 {enq['p50_ms']:.2f} vs {echo['p50_ms']:.2f} ms)")
if results:
    with open(results, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
sys.exit(0 if ok else 1)
PY

for name in broker echo; do
  pid_var="${name}_pid"
  serve_stop "${!pid_var}"
  printf -v "$pid_var" '%s' ""
  echo "$name exited with status $stopped_status after SIGTERM" >&2
  if [[ "$stopped_status" -ne 0 ]]; then
    tail -n 50 "$tmp/$name.stderr" >&2
    status=1
  fi
done
exit "$status"
