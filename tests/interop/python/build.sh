#!/usr/bin/env bash
# Prepares the Python conformance worker: the client's venv with the jobbroker package built from
# this checkout (client/python/test.sh --build-only, run only when the venv lacks the package or
# an older build is installed, so a harness already using the venv is not disturbed), then a
# syntax check of the worker. Quiet on success.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
python="$repo/client/python/.venv/bin/python"
# The installed package is current when it has what the worker uses (Snooze, progress,
# ClientOptions).
check='import jobbroker; jobbroker.Snooze; jobbroker.JobContext.progress; jobbroker.ClientOptions'
if [[ ! -x "$python" ]] || ! "$python" -c "$check" >/dev/null 2>&1; then
  log="$(mktemp)"
  if ! "$repo/client/python/test.sh" --build-only >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
fi
"$python" -m py_compile "$repo/tests/interop/python/conformance_worker.py"
