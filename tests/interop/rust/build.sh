#!/usr/bin/env bash
# Builds the Rust conformance worker (client/rust/examples/conformance_worker.rs, written on the
# library Worker). Quiet on success; cargo's errors on failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../client/rust"
if ! out="$(cargo build --locked -j1 --example conformance_worker 2>&1)"; then
  printf '%s\n' "$out" >&2
  exit 1
fi
