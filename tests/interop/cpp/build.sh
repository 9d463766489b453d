#!/usr/bin/env bash
# Builds the C++ conformance worker in the configured release tree at build/ (a clean machine
# builds everything before the harness runs). Quiet on success.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
out="$(cmake --build "$root/build" --target interop_conformance_worker -j1 2>&1)" || {
  echo "$out" >&2
  exit 1
}
