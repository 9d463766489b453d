#!/usr/bin/env bash
# Cross-language durable steps: a job whose worker was SIGKILLed in one language resumes in
# another (python -> go -> typescript -> python), against the real broker
# ($JOBBROKER_BIN, default <repo>/build/server/jobbroker). Extra arguments go to the driver
# (e.g. --all-pairs).
#
# Needs the three clients built by their own test.sh first:
#   client/python/test.sh  (client/python/.venv with the jobbroker package)
#   client/typescript/test.sh  (client/typescript/dist and node_modules)
#   client/go needs nothing built (its module is used through a replace directive)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

python="$repo/client/python/.venv/bin/python"
missing=()
if [[ ! -x "$python" ]] || ! "$python" -c 'import jobbroker.v1.steps_pb2' 2>/dev/null; then
  missing+=("Python client (run client/python/test.sh)")
fi
if [[ ! -f "$repo/client/typescript/dist/src/index.js" || ! -d "$repo/client/typescript/node_modules" ]]; then
  missing+=("TypeScript client (run client/typescript/test.sh)")
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  printf 'interop: missing build: %s\n' "${missing[@]}" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "== go build (tests/interop/go)"
(cd "$here/go" && go build -o "$tmp/interop-go-worker" .)

echo "== durable steps across languages"
"$python" "$here/steps_interop.py" --go-worker "$tmp/interop-go-worker" "$@"
