#!/usr/bin/env bash
# Starts the Rust conformance worker with the harness's arguments; exec, so that the PID the
# harness holds (SIGSTOP, SIGCONT, SIGTERM, exit code) is the worker's own.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# build.sh built it where cargo puts it: $CARGO_TARGET_DIR when set, else the crate's target/.
exec "${CARGO_TARGET_DIR:-$here/../../../client/rust/target}/debug/examples/conformance_worker" "$@"
