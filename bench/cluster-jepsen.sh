#!/usr/bin/env bash
# The long mode of the cluster harness (tests/cluster/jepsen/README.md): 110 nemeses (every
# kind of CLUSTER.md eleven times) under 12,000 jobs, about 20 minutes here. CI runs 12
# (scripts/test-all.sh, suite jepsen). Extra arguments go to the harness (--seed S to replay).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exec "$root/tests/cluster/jepsen/run.sh" --nemeses "${NEMESES:-110}" --jobs "${JOBS:-12000}" "$@"
