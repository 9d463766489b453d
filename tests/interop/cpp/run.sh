#!/usr/bin/env bash
# Starts the C++ conformance worker with the harness's arguments (CONFORMANCE.md). exec: the
# harness signals and waits for this very PID.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
exec "$root/build/tests/interop/cpp/interop_conformance_worker" "$@"
