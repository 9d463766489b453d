#!/usr/bin/env bash
# End-to-end bench of the worker helpers against a freshly started broker: the workload of
# `jobbroker-bench stream --workers 1 --in-flight K --concurrency 4 --producer-batch 100 --jobs N`
# (producers enqueue N jobs of 100 bytes in EnqueueBatch calls of 100, 4 in flight, while one
# worker handles them with a no-op handler at concurrency K), timed from the first enqueue to the
# answer to the last ack. For each K it runs, per language of LANGS, one program written on that
# client's library Worker: python_e2e.py, typescript_e2e.mjs, go/ (Go), java/JavaE2e.java (Java),
# rust/ (Rust) and, for reference, the C++ Worker through jobbroker-bench itself (cpp).
#
# Each run prints jobbroker-bench's JSON line (mode stream-python, stream-typescript, stream-go,
# stream-java, stream-rust, stream), with one field added here: broker_cpu_seconds, the broker's
# user+system CPU during the run (from /proc), which is what batching pushes and acks saves.
#
# The broker gets a temp data dir and free ports (read from its "serving" line) and is stopped
# with SIGTERM at the end; a non-zero exit status from it fails the script. What a language needs
# is built first, before any timing, with its own tools: client/python/test.sh --build-only (the
# .venv and the wheel); client/typescript/test.sh --build-only (node_modules from the lock file and
# dist/); go build of go/ (its go.mod replaces the client with ../../../client/go) into go/.bin;
# javac of java/JavaE2e.java into java/.build against client/java/target/classes (mvn compile
# offline if missing) and the client's runtime dependency jars (mvn dependency:build-classpath),
# as tests/interop/java/build.sh does; cargo build --release of rust/ (a path dependency on
# ../../../client/rust) into rust/target (cargo updates rust/Cargo.lock if the client's
# dependencies changed).
#
# Environment: BUILD_DIR (default: ../../build next to this script; needs the jobbroker and, for
# the C++ reference, jobbroker-bench targets), JOBS (20000), IN_FLIGHT ("16 64 256"),
# PAYLOAD_BYTES (100), LANGS ("python typescript cpp"; also go, java, rust, e.g.
# LANGS="go java rust"), RESULTS (a file to append the JSON lines to; default: none), TMPDIR (where
# the data dir goes).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
broker="$build_dir/server/jobbroker"
bench="$build_dir/bench/jobbroker-bench"
jobs="${JOBS:-20000}"
in_flight="${IN_FLIGHT:-16 64 256}"
payload="${PAYLOAD_BYTES:-100}"
langs="${LANGS:-python typescript cpp}"

if [[ ! -x "$broker" ]]; then
  echo "run.sh: $broker not built (cmake --build $build_dir --target jobbroker jobbroker-bench)" >&2
  exit 2
fi
if [[ " $langs " == *" cpp "* && ! -x "$bench" ]]; then
  echo "run.sh: $bench not built: skipping the C++ reference runs" >&2
  langs="${langs//cpp/}"
fi

export JOBBROKER_BIN="$broker"
if [[ " $langs " == *" python "* ]]; then
  echo "+ client/python/test.sh --build-only" >&2
  "$root/client/python/test.sh" --build-only >&2
fi
if [[ " $langs " == *" typescript "* ]]; then
  echo "+ client/typescript/test.sh --build-only" >&2
  "$root/client/typescript/test.sh" --build-only >&2
fi
if [[ " $langs " == *" go "* ]]; then
  echo "+ go build (bench/workers/go)" >&2
  (cd "$here/go" && go build -o "$here/go/.bin/go_e2e" .) >&2
fi
if [[ " $langs " == *" java "* ]]; then
  echo "+ javac bench/workers/java/JavaE2e.java" >&2
  java_client="$root/client/java"
  java_out="$here/java/.build"
  mkdir -p "$java_out"
  if [[ ! -d "$java_client/target/classes/dev/jobbroker/client" ]]; then
    (cd "$java_client" && mvn -B -q -ntp -o compile) >&2
  fi
  # The client's runtime dependency jars in ~/.m2: offline first, Maven Central only when the
  # dependency plugin itself is missing.
  if [[ ! -s "$java_out/classpath.txt" ||
    "$java_client/pom.xml" -nt "$java_out/classpath.txt" ]]; then
    (cd "$java_client" &&
      { mvn -B -q -ntp -o dependency:build-classpath -DincludeScope=runtime \
          -Dmdep.outputFile="$java_out/classpath.txt" >/dev/null 2>&1 ||
        mvn -B -q -ntp dependency:build-classpath -DincludeScope=runtime \
          -Dmdep.outputFile="$java_out/classpath.txt" >/dev/null; })
  fi
  java_cp="$java_client/target/classes:$(cat "$java_out/classpath.txt")"
  javac -nowarn -d "$java_out/classes" -cp "$java_cp" "$here/java/JavaE2e.java" >&2
  # The class path goes in an argument file (java @FILE), so that the command run.sh echoes
  # stays readable.
  printf -- '-cp "%s"\n' "$java_out/classes:$java_cp" >"$java_out/java.args"
fi
if [[ " $langs " == *" rust "* ]]; then
  echo "+ cargo build --release (bench/workers/rust)" >&2
  cargo build --release --quiet --manifest-path "$here/rust/Cargo.toml" \
    --target-dir "$here/rust/target" >&2
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-workers-bench.XXXXXX")"
broker_pid=""
# shellcheck source=../lib/serve.sh
source "$here/../lib/serve.sh"
cleanup() {
  if [[ -n "$broker_pid" ]]; then serve_stop "$broker_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

serve_broker "$broker" "$tmp" || exit 1
address="$broker_address"
echo "broker pid $broker_pid serving at $address, data in $tmp/data" >&2

# The broker's user+system CPU so far, in clock ticks (fields 14 and 15 of /proc/PID/stat; the
# command name before them is in parentheses and has no spaces here).
broker_ticks() {
  awk '{ print $14 + $15 }' "/proc/$broker_pid/stat"
}
hz="$(getconf CLK_TCK)"

# Runs one bench command; its JSON line gets broker_cpu_seconds and goes to bench.out.
run() {
  echo "+ $*" >&2
  local before after line cpu status=0
  before="$(broker_ticks)"
  "$@" >"$tmp/one.out" || status=$?
  after="$(broker_ticks)"
  line="$(grep '^{' "$tmp/one.out" | tail -n 1 || true)"
  if [[ -n "$line" ]]; then
    cpu="$(awk -v t="$((after - before))" -v hz="$hz" 'BEGIN { printf "%.2f", t / hz }')"
    echo "${line%\}},\"broker_cpu_seconds\":$cpu}" | tee -a "$tmp/bench.out"
  fi
  return "$status"
}

status=0
for k in $in_flight; do
  for lang in $langs; do
    case "$lang" in
      python)
        run "$root/client/python/.venv/bin/python" "$here/python_e2e.py" --address "$address" \
          --jobs "$jobs" --in-flight "$k" --concurrency 4 --producer-batch 100 \
          --payload-bytes "$payload" || status=1
        ;;
      typescript)
        run node "$here/typescript_e2e.mjs" --address "$address" --jobs "$jobs" --in-flight "$k" \
          --concurrency 4 --producer-batch 100 --payload-bytes "$payload" || status=1
        ;;
      go)
        run "$here/go/.bin/go_e2e" --address "$address" --jobs "$jobs" --in-flight "$k" \
          --concurrency 4 --producer-batch 100 --payload-bytes "$payload" || status=1
        ;;
      java)
        run java @"$here/java/.build/java.args" JavaE2e --address "$address" --jobs "$jobs" \
          --in-flight "$k" --concurrency 4 --producer-batch 100 --payload-bytes "$payload" ||
          status=1
        ;;
      rust)
        run "$here/rust/target/release/rust_e2e" --address "$address" --jobs "$jobs" \
          --in-flight "$k" --concurrency 4 --producer-batch 100 --payload-bytes "$payload" ||
          status=1
        ;;
      cpp)
        run "$bench" stream --address "$address" --workers 1 --in-flight "$k" --concurrency 4 \
          --producer-batch 100 --jobs "$jobs" --payload-bytes "$payload" || status=1
        ;;
      *)
        echo "run.sh: unknown language $lang in LANGS" >&2
        status=1
        ;;
    esac
  done
done
if [[ -n "${RESULTS:-}" && -f "$tmp/bench.out" ]]; then
  cat "$tmp/bench.out" >>"$RESULTS"
fi

stop_broker "$tmp" || status=1
exit "$status"
