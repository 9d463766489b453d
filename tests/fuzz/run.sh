#!/usr/bin/env bash
# Builds the libFuzzer targets (CMakePresets.json: fuzz; clang-14) and runs them all at once,
# each for FUZZ_SECONDS (default 60), starting from a copy of the committed seed corpus, so the
# repository is never written. Prints per target the executions, exec/s, coverage (libFuzzer's
# cov: and ft:) and the corpus size it ended with. Exits 1 if any target found a crash, a
# leak, a timeout or a model mismatch, and prints the input that reproduces it (kept, with the
# target's log, in a directory under /tmp; README.md says how to replay it).
#
#   tests/fuzz/run.sh                          # both targets, 60 s each, side by side
#   FUZZ_SECONDS=600 tests/fuzz/run.sh core_model_fuzzer
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
seconds="${FUZZ_SECONDS:-60}"
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(core_model_fuzzer request_fuzzer)

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

work="$(mktemp -d /tmp/jobbroker-fuzz.XXXXXX)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
if command -v llvm-symbolizer-14 >/dev/null; then
  export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14)}"
fi

summary=()
failed=0
# The targets run at the same time: libFuzzer runs one input at a time, so each keeps a core of
# its own (CI has 2) and the suite takes one FUZZ_SECONDS, not one per target.
declare -A pids
for target in "${targets[@]}"; do
  bin="$root/build/fuzz/tests/fuzz/$target"
  seeds="$root/tests/fuzz/corpus/$target"
  [ -x "$bin" ] || { echo "no fuzz target named '$target'"; exit 2; }
  corpus="$work/$target/corpus"
  artifacts="$work/$target/artifacts"
  mkdir -p "$corpus" "$artifacts"
  cp "$seeds"/* "$corpus"/
  extra=()
  [ -f "$root/tests/fuzz/$target.dict" ] && extra+=("-dict=$root/tests/fuzz/$target.dict")
  echo "=== $target: ${seconds}s from $(ls "$corpus" | wc -l) seeds ==="
  # -timeout: one input running this long is a hang. -rss_limit_mb: libFuzzer's default.
  "$bin" "$corpus" -max_total_time="$seconds" -print_final_stats=1 -timeout=30 \
    -rss_limit_mb=2048 -artifact_prefix="$artifacts/" "${extra[@]}" >"$work/$target/fuzz.log" 2>&1 &
  pids[$target]=$!
done
for target in "${targets[@]}"; do
  bin="$root/build/fuzz/tests/fuzz/$target"
  artifacts="$work/$target/artifacts"
  log="$work/$target/fuzz.log"
  status=0
  wait "${pids[$target]}" || status=$?
  echo
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
  last="$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
  corp="$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$last")"
  result=passed
  if [ "$status" -ne 0 ] || [ -n "$(ls -A "$artifacts")" ]; then
    result=FAILED
    failed=1
    grep -E '==== |^at T|ERROR: |SUMMARY: ' "$log" | head -n 5 || true
    for found in "$artifacts"/*; do
      [ -e "$found" ] && echo "reproduce: $bin $found"
    done
    echo "log: $log"
  fi
  line="$(printf '%-18s %-6s execs %-9s exec/s %-6s cov %-6s ft %-7s corpus %s (entries/bytes)' \
    "$target" "$result" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")"
  echo "$line"
  summary+=("$line")
done

echo
echo "=== fuzz summary (${seconds}s per target) ==="
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
  echo "kept for the reproducers: $work"
  exit 1
fi
rm -rf "$work"
