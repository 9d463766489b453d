#!/usr/bin/env bash
# Starts the Ruby conformance worker (../CONFORMANCE.md) on the library in client/ruby/lib.
# exec: the harness signals and waits for this very PID.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
exec ruby -I "$repo/client/ruby/lib" "$here/conformance_worker.rb" "$@"
