#!/usr/bin/env bash
# Installs the TypeScript client's packages from its lock file, builds and packs the package
# (`npm pack`: its prepack runs scripts/build.mjs: protobuf code, version from the root VERSION,
# the CommonJS and ESM builds, LICENSE), builds the sign-up example, runs every test against the
# real broker ($JOBBROKER_BIN, default <repo>/build/server/jobbroker), then the install test
# (scripts/install-test.sh: the packed .tgz in a scratch npm project, the examples over TLS with a
# token). Needs node 20+, npm, protoc and openssl.
# `test.sh --build-only` stops after building the package (no tarball).
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
# --build-only: stop here, with node_modules and the freshly built package (bench/workers/run.sh).
if [[ "${1:-}" == "--build-only" ]]; then
  (cd "$here" && npm run --silent build)
  exit 0
fi
pack="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-ts-pack-XXXXXX")"
trap 'rm -rf "$pack"' EXIT
(cd "$here" && npm pack --pack-destination "$pack" --loglevel=error >/dev/null)
tgz="$(ls "$pack"/*.tgz)"
echo "test.sh: packed $(basename "$tgz")"
install "$example"
(cd "$example" && npm run --silent build)
cd "$here"
npm test --silent
"$here/scripts/install-test.sh" "$tgz"
