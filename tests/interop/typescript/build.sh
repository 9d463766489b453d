#!/usr/bin/env bash
# Prepares the TypeScript conformance worker: it is plain ESM on the client's built package, so
# this only builds the package when client/typescript/test.sh has not, and checks the syntax.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
client="$here/../../../client/typescript"
if [[ ! -f "$client/dist/esm/index.js" ]]; then
  "$client/test.sh" --build-only >/dev/null
fi
node --check "$here/conformance_worker.mjs"
