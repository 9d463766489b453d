#!/usr/bin/env bash
# Runs the crash-consistency harness (README.md) from an existing build; builds nothing.
#
#   tests/crash/run.sh                      # CI: 20 broker kills, a random seed
#   tests/crash/run.sh --kills 200 --jobs 20000   # nightly
#   tests/crash/run.sh --seed 1234 --kills 20     # replay a seed
#
# BUILD names the build directory (default: build), relative to the repository root unless
# absolute. The exit code is the harness's: 0 green, 1 violations or a run that did not settle,
# 2 the harness could not run.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD:-build}"
[[ "$build" = /* ]] || build="$root/$build"
harness="$build/tests/crash/crash_harness"
if [[ ! -x "$harness" ]]; then
  echo "run.sh: $harness is missing; build it first: cmake --build $build --target crash_harness" >&2
  exit 2
fi
exec "$harness" "$@"
