#!/usr/bin/env bash
# The clients against the real broker ($JOBBROKER_BIN, default <repo>/build/server/jobbroker):
#   1. the worker conformance matrix: every language's worker through the same scenarios
#      (conformance.py; CONFORMANCE.md says how it talks to a language's worker);
#   2. durable steps across languages: a job whose worker was SIGKILLed in one language resumes
#      in another (steps_interop.py).
# Extra arguments go to steps_interop.py (e.g. --all-pairs).
#
# Needs each client's own test.sh first (scripts/test-all.sh runs this suite after them): the
# harness runs with client/python/.venv, and each tests/interop/<lang>/build.sh uses what its
# client's suite built.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

python="$repo/client/python/.venv/bin/python"
if [[ ! -x "$python" ]] || ! "$python" -c 'import jobbroker.v1.steps_pb2' 2>/dev/null; then
  echo "interop: missing build: Python client (run client/python/test.sh)" >&2
  exit 1
fi

status=0
echo "== worker conformance (every language x every scenario)"
"$python" "$here/conformance.py" || status=1

echo "== durable steps across languages"
if [[ ! -f "$repo/client/typescript/dist/src/index.js" || ! -d "$repo/client/typescript/node_modules" ]]; then
  echo "interop: missing build: TypeScript client (run client/typescript/test.sh)" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$here/go" && go build -o "$tmp/interop-go-worker" .)
"$python" "$here/steps_interop.py" --go-worker "$tmp/interop-go-worker" "$@" || status=1
exit "$status"
