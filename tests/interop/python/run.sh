#!/usr/bin/env bash
# Starts the Python conformance worker; exec, so the harness's PID is the worker's own.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
exec "$repo/client/python/.venv/bin/python" "$repo/tests/interop/python/conformance_worker.py" "$@"
