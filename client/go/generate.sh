#!/usr/bin/env bash
# Regenerates jobbrokerv1/ (the Go code of proto/jobbroker/v1/*.proto) with the system protoc
# and the protoc-gen-go / protoc-gen-go-grpc versions pinned by the `tool` lines of go.mod.
#
#   ./generate.sh          writes ./jobbrokerv1/*.go
#   ./generate.sh DIR      writes DIR/jobbrokerv1/*.go instead (test.sh uses it to check drift)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$here}"
protoc="${PROTOC:-protoc}"

bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
(cd "$here" && go build -o "$bin" \
  google.golang.org/protobuf/cmd/protoc-gen-go \
  google.golang.org/grpc/cmd/protoc-gen-go-grpc)

mkdir -p "$out/jobbrokerv1"
rm -f "$out"/jobbrokerv1/*.pb.go
PATH="$bin:$PATH" "$protoc" \
  -I "$repo/proto" \
  --go_out="$out" --go_opt=module=jobbroker.dev/client/go \
  --go-grpc_out="$out" --go-grpc_opt=module=jobbroker.dev/client/go \
  "$repo"/proto/jobbroker/v1/*.proto
