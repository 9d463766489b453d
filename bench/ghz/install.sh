#!/usr/bin/env bash
# Installs ghz (the gRPC load generator, github.com/bojand/ghz) at a pinned version into
# bench/ghz/bin, built from source with `go install` through the Go module proxy. Idempotent: a
# bin/ghz already built from the pinned module version is kept.
#
# Environment: GHZ_VERSION (default below; changing it rebuilds).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
version="${GHZ_VERSION:-v0.120.0}"
bin_dir="$here/bin"
ghz="$bin_dir/ghz"

# `go version -m` reads the module version stamped into the binary; `ghz --version` would only
# say "dev", since the release's -ldflags are not applied by go install.
built_version() {
  go version -m "$1" 2>/dev/null | awk '$1 == "mod" && $2 == "github.com/bojand/ghz" { print $3 }'
}

command -v go >/dev/null || {
  echo "ghz/install.sh: 'go' is not on PATH; ghz is built from source with it" >&2
  exit 1
}
if [[ -x "$ghz" && "$(built_version "$ghz")" == "$version" ]]; then
  exit 0
fi

# Build into a scratch dir and move into place, so an interrupted build never leaves a
# half-written bin/ghz that the check above would then trust.
mkdir -p "$bin_dir"
scratch="$(mktemp -d "$bin_dir/.install.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
echo "ghz/install.sh: building github.com/bojand/ghz/cmd/ghz@$version (about a minute)" >&2
GOBIN="$scratch" GOFLAGS=-buildvcs=false \
  go install -ldflags "-X main.version=$version" "github.com/bojand/ghz/cmd/ghz@$version"
mv -f "$scratch/ghz" "$ghz"
echo "ghz/install.sh: installed ghz $("$ghz" --version 2>&1) at $ghz" >&2
