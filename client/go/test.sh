#!/usr/bin/env bash
# Builds and tests the Go client against the real broker binary
# ($JOBBROKER_BIN, default <repo>/build/server/jobbroker).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

echo "== go mod download (versions pinned by go.mod / go.sum)"
go mod download

echo "== generated code matches proto/ (protoc $(protoc --version | awk '{print $2}'))"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
./generate.sh "$tmp"
if ! diff -ru jobbrokerv1 "$tmp/jobbrokerv1"; then
  echo "jobbrokerv1/ is stale: run client/go/generate.sh and commit the result" >&2
  exit 1
fi

echo "== gofmt"
unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then
  echo "not gofmt-ed:" >&2
  echo "$unformatted" >&2
  exit 1
fi

echo "== go vet / go build"
go vet ./...
go build ./...
# jobbrokerotel is a module of its own (so the library does not depend on OpenTelemetry).
(cd jobbrokerotel && go mod download && go vet ./... && go build ./...)

echo "== go test"
set +e
go test -count=1 -timeout 8m -v ./... 2>&1 | tee "$tmp/test.log"
rc=${PIPESTATUS[0]}
(cd jobbrokerotel && go test -count=1 -timeout 3m -v ./...) 2>&1 | tee -a "$tmp/test.log"
otel_rc=${PIPESTATUS[0]}
set -e
if [[ $rc -eq 0 ]]; then rc=$otel_rc; fi

echo "== install test (the module as a tagged version gives it, example worker over TLS + token)"
./install_test.sh 2>&1 | tee "$tmp/install.log"
install_rc=${PIPESTATUS[0]}
if [[ $rc -eq 0 ]]; then rc=$install_rc; fi
passed=$(grep -c -- '^--- PASS' "$tmp/test.log" || true)
failed=$(grep -c -- '^--- FAIL' "$tmp/test.log" || true)
echo "${passed} passed, ${failed} failed; install test: $([[ $install_rc -eq 0 ]] && echo passed || echo FAILED)"
exit "$rc"
