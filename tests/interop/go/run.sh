#!/usr/bin/env bash
# Runs the conformance worker built by build.sh; exec, so that the harness's PID is the worker's.
exec "$(dirname "${BASH_SOURCE[0]}")/.bin/conformance" "$@"
