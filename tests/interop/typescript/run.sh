#!/usr/bin/env bash
# Starts the TypeScript conformance worker with the harness's arguments (CONFORMANCE.md). exec:
# the harness signals and waits for this very PID.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec node "$here/conformance_worker.mjs" "$@"
