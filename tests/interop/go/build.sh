#!/usr/bin/env bash
# Builds the Go conformance worker (conformance/, against client/go through go.mod's replace)
# into .bin/conformance. Quiet on success.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
go build -o .bin/conformance ./conformance
