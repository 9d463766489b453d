#!/usr/bin/env bash
# The long mode of the cluster simulation (tests/cluster/sim): SEEDS seeds from FIRST, split over
# JOBS cluster_sim processes side by side. ctest runs 2,000 seeds; this is the run the issue's
# "10,000 seeds and more" is measured by. Prints each process's summary line, then the total.
# A failing seed stops its process and prints the command that replays it.
#   bench/cluster-sim.sh                        # seeds 0-9999 on 2 processes
#   SEEDS=50000 FIRST=10000 bench/cluster-sim.sh --nodes 5
# Environment: BUILD_DIR (default: ../build next to this script), SEEDS (10000), FIRST (0),
# JOBS (2). Arguments go to every cluster_sim (--nodes, --partitions, --bug).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
sim="$build_dir/tests/cluster/sim/cluster_sim"
seeds="${SEEDS:-10000}"
first="${FIRST:-0}"
jobs="${JOBS:-2}"
[ -x "$sim" ] || { echo "cluster-sim: $sim is not built (cd build && ninja cluster_sim)" >&2; exit 1; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-cluster-sim.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
per=$(((seeds + jobs - 1) / jobs))
pids=()
start=$SECONDS
for ((j = 0; j < jobs; j++)); do
  lo=$((first + j * per))
  hi=$((lo + per - 1))
  last=$((first + seeds - 1))
  [ "$lo" -gt "$last" ] && break
  [ "$hi" -gt "$last" ] && hi=$last
  "$sim" --seeds "$lo-$hi" "$@" >"$tmp/$j.out" 2>&1 &
  pids+=($!)
done
failed=0
for j in "${!pids[@]}"; do
  wait "${pids[$j]}" || failed=1
  cat "$tmp/$j.out"
done
echo "cluster-sim: $seeds seeds from $first on ${#pids[@]} processes in $((SECONDS - start)) s:" \
  "$([ "$failed" -eq 0 ] && echo "all passed" || echo "FAILED")"
exit "$failed"
