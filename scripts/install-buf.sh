#!/usr/bin/env bash
# Prints the path of a buf binary of the pinned version, building it from the Go module proxy
# the first time. Built once per machine, outside the checkout, so clean clones reuse it.
set -euo pipefail
BUF_VERSION=v1.75.0
dir="${JOBBROKER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobbroker-tools}/buf-$BUF_VERSION"
if [ ! -x "$dir/buf" ]; then
  echo "install-buf: building buf $BUF_VERSION (once per machine)" >&2
  mkdir -p "$dir"
  GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/bufbuild/buf/cmd/buf@$BUF_VERSION" >&2
fi
echo "$dir/buf"
