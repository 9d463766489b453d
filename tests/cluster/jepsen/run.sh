#!/usr/bin/env bash
# Runs the cluster harness (README.md) from an existing build; builds only Toxiproxy, once per
# machine (scripts/install-toxiproxy.sh).
#
#   tests/cluster/jepsen/run.sh                         # CI: 12 nemeses (every kind), a random seed
#   tests/cluster/jepsen/run.sh --nemeses 110 --jobs 12000   # bench mode: over 100 nemeses
#   tests/cluster/jepsen/run.sh --seed 1234 --nemeses 12     # replay a seed's schedule
#
# BUILD names the build directory (default: build). The exit code is the harness's: 0 green,
# 1 violations or problems, 2 the rig could not run.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
build="${BUILD:-build}"
[[ "$build" = /* ]] || build="$root/$build"
harness="$build/tests/cluster/jepsen/cluster_harness"
if [[ ! -x "$harness" ]]; then
  echo "run.sh: $harness is missing; build it first: cmake --build $build --target cluster_harness" >&2
  exit 2
fi
toxiproxy="$("$root/scripts/install-toxiproxy.sh")"
exec "$harness" --toxiproxy "$toxiproxy" "$@"
