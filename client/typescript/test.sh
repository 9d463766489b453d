#!/usr/bin/env bash
# Installs the TypeScript client's packages from its lock file, generates the protobuf code,
# builds the client and the sign-up example, and runs every test against the real broker
# ($JOBBROKER_BIN, default <repo>/build/server/jobbroker). Needs node 20+, npm and protoc.
# `test.sh --build-only` stops after building the package.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
example="$root/examples/typescript/signup"
export JOBBROKER_BIN="${JOBBROKER_BIN:-$root/build/server/jobbroker}"

if [[ ! -x "$JOBBROKER_BIN" ]]; then
  echo "test.sh: no broker binary at $JOBBROKER_BIN (build the C++ tree or set JOBBROKER_BIN)" >&2
  exit 1
fi

install() { "$root/scripts/npm-ci-once.sh" "$1"; }

install "$here"
(cd "$here" && npm run --silent build)
# --build-only: stop here, with node_modules and the freshly built package (bench/workers/run.sh).
if [[ "${1:-}" == "--build-only" ]]; then
  exit 0
fi
install "$example"
(cd "$example" && npm run --silent build)
cd "$here"
npm test --silent
