#!/usr/bin/env bash
# Runs the dashboard's headless-browser tests against the real broker ($JOBBROKER_BIN, default
# <repo>/build/server/jobbroker) in Debian's Chromium (/usr/bin/chromium, or $CHROMIUM_BIN).
# Needs node 20+ and npm; installs the packages from package-lock.json.
#   test.sh                    every test; screenshots land in tests/ui/screenshots/
#   test.sh FILE.test.mjs...   only those files
#   test.sh --update-docs      then copies the overview screenshot to docs/images/dashboard.png
# JOBBROKER_UI_DIR=<repo>/ui serves the dashboard from that folder instead of the binary's
# embedded copy (working on ui/ without relinking); serving.test.mjs still checks the binary.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export JOBBROKER_BIN="${JOBBROKER_BIN:-$root/build/server/jobbroker}"
chromium="${CHROMIUM_BIN:-/usr/bin/chromium}"

update_docs=false
files=()
for arg in "$@"; do
  case "$arg" in
    --update-docs) update_docs=true ;;
    *) files+=("$arg") ;;
  esac
done

if [[ ! -x "$JOBBROKER_BIN" ]]; then
  echo "test.sh: no broker binary at $JOBBROKER_BIN (build the C++ tree or set JOBBROKER_BIN)" >&2
  exit 1
fi
if [[ ! -x "$chromium" ]]; then
  echo "test.sh: no Chromium at $chromium: scripts/install-deps.sh --tests installs it" >&2
  exit 1
fi

"$root/scripts/npm-ci-once.sh" "$here"

cd "$here"
if [[ ${#files[@]} -eq 0 ]]; then
  files=(*.test.mjs)
fi
# One file at a time: each starts its own broker and browser, and the machine is small.
node --test --test-concurrency=1 --test-reporter=spec "${files[@]}"

if $update_docs; then
  mkdir -p "$root/docs/images"
  cp screenshots/overview.png "$root/docs/images/dashboard.png"
  echo "test.sh: docs/images/dashboard.png updated ($(stat -c %s "$root/docs/images/dashboard.png") bytes)"
fi
