#!/usr/bin/env bash
# Prints the path of a Toxiproxy server of the pinned version (the fault-injecting TCP proxy the
# cluster harness puts on every link, tests/cluster/jepsen/), building it from the Go module
# proxy the first time. Built once per machine, outside the checkout, like install-helm.sh.
set -euo pipefail
TOXIPROXY_VERSION=v2.5.0
dir="${JOBBROKER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobbroker-tools}/toxiproxy-$TOXIPROXY_VERSION"
if [ ! -x "$dir/toxiproxy-server" ]; then
  echo "install-toxiproxy: building toxiproxy $TOXIPROXY_VERSION (once per machine)" >&2
  mkdir -p "$dir/bin"
  GOBIN="$dir/bin" GOFLAGS=-mod=mod CGO_ENABLED=0 go install -ldflags "-s -w" \
    "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2
  mv "$dir/bin/server" "$dir/toxiproxy-server"
  rmdir "$dir/bin"
fi
echo "$dir/toxiproxy-server"
