#!/usr/bin/env bash
# Install test of the Go client, as a user of a tagged version gets it (test.sh runs it).
#
# Go has no artifact beyond the module: what a tag publishes is the module zip, which holds the
# files under the module root (committed or about to be, i.e. not git-ignored) minus nested
# modules (jobbrokerotel/ is one) and vendor/. This script
#   1. checks LICENSE (a copy of the root LICENSE: a module zip holds nothing from above its
#      root) in both modules, and that jobbrokerotel requires the version of ../VERSION;
#   2. builds the zips of jobbroker.dev/client/go and jobbroker.dev/client/go/jobbrokerotel
#      at v$(cat VERSION), with the module zip's layout (module@version/...), and unpacks them
#      outside the repository;
#   3. makes a scratch module, also outside the repository, that `require`s both at that
#      version with a `replace` to the unpacked zips (what the module cache holds for a tag),
#      copies the example worker and producer into it, `go mod tidy`, `go mod verify`,
#      `go list -m all`, `go vet`, `go build`, and proves no package comes from the source tree;
#   4. starts the real broker with TLS (a throwaway CA and a certificate for IP 127.0.0.1) and
#      tokens, runs the example worker with -ca and $JOBBROKER_TOKEN, enqueues a job with the
#      example producer and waits (Admin.WatchJob, from a program that also uses jobbrokerotel)
#      until the worker has completed it; an enqueue without the token must be refused.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
broker_bin="${JOBBROKER_BIN:-$repo/build/server/jobbroker}"
version="$(tr -d '[:space:]' <"$repo/VERSION")"
export GOWORK=off GOFLAGS="${GOFLAGS:-} -buildvcs=false"

tmp="$(mktemp -d)"
broker_pid="" worker_pid=""
cleanup() {
  [[ -n "$worker_pid" ]] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  [[ -n "$broker_pid" ]] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
  chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "install test: $*" >&2
  for f in "$tmp"/broker/broker.log "$tmp"/worker.log; do [[ -f "$f" ]] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
  exit 1
}

echo "== LICENSE and version"
cmp -s "$repo/LICENSE" "$here/LICENSE" || fail "client/go/LICENSE is not a copy of the root LICENSE"
cmp -s "$repo/LICENSE" "$here/jobbrokerotel/LICENSE" || fail "client/go/jobbrokerotel/LICENSE is not a copy of the root LICENSE"
grep -q "^const Version = \"$version\"$" "$here/jobbroker/client.go" || fail "jobbroker.Version is not $version (VERSION)"
grep -Eq "^[[:space:]]*jobbroker.dev/client/go v$version\$" "$here/jobbrokerotel/go.mod" ||
  fail "jobbrokerotel/go.mod must require jobbroker.dev/client/go v$version (VERSION)"

# list_files: the files of the current folder a commit would carry (NUL-separated): tracked or
# new, not git-ignored. Outside a git checkout (a source tarball), every file but the example
# binaries and test binaries that .gitignore names.
list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -z .
  else
    find . -type f ! -path ./worker ! -path ./producer ! -name '*.test' -printf '%P\0'
  fi
}

# module_zip DIR MODULE OUT: the zip a tag of MODULE (rooted at DIR) would publish.
module_zip() {
  local dir="$1" module="$2" out="$3" stage="$tmp/stage/$2@v$version"
  mkdir -p "$stage"
  # Nested modules (a folder with a go.mod of its own) are not part of this module.
  local nested
  nested="$(cd "$dir" && find . -mindepth 2 -name go.mod -printf '%h\n' | sed 's|^\./||')"
  (cd "$dir" && list_files |
    while IFS= read -r -d '' f; do
      [[ -f "$f" ]] || continue # deleted in the work tree
      case "$f" in vendor/* | */vendor/*) continue ;; esac
      local skip=""
      for n in $nested; do [[ "$f" == "$n"/* ]] && skip=1; done
      [[ -z "$skip" ]] && printf '%s\0' "$f"
    done | xargs -0 cp --parents -t "$stage")
  (cd "$tmp/stage" && python3 -c '
import os, sys, zipfile
root, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            z.write(os.path.join(d, f))
' "$module@v$version" "$out")
  rm -rf "$tmp/stage"
}
# zip_list ZIP: the files of a zip, one a line. (python3, which CI has; zip/unzip may be absent.)
zip_list() { python3 -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$1"; }
zip_extract() { python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; }

echo "== module zips of v$version"
module_zip "$here" jobbroker.dev/client/go "$tmp/client.zip"
module_zip "$here/jobbrokerotel" jobbroker.dev/client/go/jobbrokerotel "$tmp/otel.zip"
for z in client:jobbroker.dev/client/go otel:jobbroker.dev/client/go/jobbrokerotel; do
  zip_list "$tmp/${z%%:*}.zip" >"$tmp/${z%%:*}.files"
  grep -Fqx "${z#*:}@v$version/LICENSE" "$tmp/${z%%:*}.files" || fail "${z%%:*}.zip has no LICENSE at its root"
done
grep -q '/jobbrokerotel/' "$tmp/client.files" && fail "client.zip holds the nested module jobbrokerotel"
grep -q '/jobbrokerv1/broker.pb.go$' "$tmp/client.files" || fail "client.zip has no generated code"
mkdir -p "$tmp/mod"
zip_extract "$tmp/client.zip" "$tmp/mod"
zip_extract "$tmp/otel.zip" "$tmp/mod"
client_dir="$tmp/mod/jobbroker.dev/client/go@v$version"
otel_dir="$tmp/mod/jobbroker.dev/client/go/jobbrokerotel@v$version"
chmod -R a-w "$tmp/mod" # read-only, like the module cache
echo "client.zip: $(wc -l <"$tmp/client.files") files, otel.zip: $(wc -l <"$tmp/otel.files") files"

echo "== scratch module"
app="$tmp/app"
mkdir -p "$app/worker" "$app/producer" "$app/waitjob"
cp "$here/examples/worker/main.go" "$app/worker/main.go"
cp "$here/examples/producer/main.go" "$app/producer/main.go"
# waitjob waits (Admin.WatchJob) until a job is terminal; it uses jobbrokerotel too, so that the
# second module is built, vetted and run as well.
cat >"$app/waitjob/main.go" <<'EOF'
// Command waitjob waits until a job is terminal and prints its state; exit 1 unless COMPLETED.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"jobbroker.dev/client/go/jobbroker"
	"jobbroker.dev/client/go/jobbrokerotel"
)

func main() {
	addr := flag.String("addr", "", "broker address")
	ca := flag.String("ca", "", "CA certificate (PEM)")
	id := flag.String("job", "", "job id")
	flag.Parse()
	client, err := jobbroker.New(jobbroker.Options{
		Address:           *addr,
		CAFile:            *ca,
		EnqueueMiddleware: []jobbroker.EnqueueMiddleware{jobbrokerotel.EnqueueMiddleware()},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	job, err := client.WaitJob(ctx, *id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(job.GetId(), job.GetState())
}
EOF
cat >"$app/go.mod" <<EOF
module example.com/jobbroker-install-test

go 1.26.0

require (
	jobbroker.dev/client/go v$version
	jobbroker.dev/client/go/jobbrokerotel v$version
)

replace (
	jobbroker.dev/client/go v$version => $client_dir
	jobbroker.dev/client/go/jobbrokerotel v$version => $otel_dir
)
EOF
# The dependencies' hashes, as the two modules lock them.
cat "$here/go.sum" "$here/jobbrokerotel/go.sum" | sort -u >"$app/go.sum"
(
  cd "$app"
  go mod tidy
  go mod verify
  go list -m all >"$tmp/modules.txt"
  grep -q "^jobbroker.dev/client/go v$version => $client_dir\$" "$tmp/modules.txt" || fail "go list -m: $(cat "$tmp/modules.txt")"
  grep '^jobbroker.dev/' "$tmp/modules.txt"
  # No package may come from the source tree.
  if go list -deps -f '{{.Dir}}' ./... | grep -F "$repo/"; then fail "packages above come from the source tree"; fi
  echo "package jobbroker.dev/client/go/jobbroker from $(go list -f '{{.Dir}}' jobbroker.dev/client/go/jobbroker)"
  go vet ./...
  go build -o "$tmp/bin/" ./...
) || fail "the scratch module does not build"

echo "== TLS and tokens"
# shellcheck source=../../tests/lib/secured_broker.sh
source "$repo/tests/lib/secured_broker.sh"
secured_broker_start "$broker_bin" "$tmp/broker" || fail "the secured broker did not start"
broker_pid="$secured_pid" addr="$secured_address" token="$secured_token"
cp "$secured_ca" "$tmp/ca.pem"
echo "broker at $addr (TLS, tokens)"

echo "== the example worker completes a job"
queue="install-$$"
(cd "$tmp" && JOBBROKER_TOKEN="$token" exec "$tmp/bin/worker" -addr "$addr" -ca "$tmp/ca.pem" -queue "$queue" \
  >"$tmp/worker.log" 2>&1) &
worker_pid=$!
# Without the token the broker refuses (proof that tokens are on).
if (cd "$tmp" && JOBBROKER_TOKEN="" "$tmp/bin/producer" -addr "$addr" -ca "$tmp/ca.pem" -queue "$queue" -n 1 \
  >"$tmp/refused.log" 2>&1); then
  fail "an enqueue without the token was accepted"
fi
grep -qi "unauthenticated" "$tmp/refused.log" || fail "enqueue without token: $(cat "$tmp/refused.log")"
out="$(cd "$tmp" && JOBBROKER_TOKEN="$token" "$tmp/bin/producer" -addr "$addr" -ca "$tmp/ca.pem" -queue "$queue" -n 1)" ||
  fail "the example producer failed: $out"
echo "$out"
job_id="$(sed -n 's/^user_1: job \([^ ]*\) .*/\1/p' <<<"$out")"
[[ -n "$job_id" ]] || fail "no job id in the producer's output"
# The worker logs the send step, then acks; wait for the log line, then for the broker's state.
for _ in $(seq 150); do
  grep -q "to=user_1@example.com" "$tmp/worker.log" && break
  kill -0 "$worker_pid" 2>/dev/null || fail "the example worker exited"
  sleep 0.1
done
grep -q "to=user_1@example.com" "$tmp/worker.log" || fail "the example worker did not run the job"
grep "to=user_1@example.com" "$tmp/worker.log"
state="$(cd "$tmp" && JOBBROKER_TOKEN="$token" "$tmp/bin/waitjob" -addr "$addr" -ca "$tmp/ca.pem" -job "$job_id" 2>&1)" ||
  fail "job $job_id did not complete: $state"
echo "$state"
[[ "$state" == "$job_id JOB_STATE_COMPLETED" ]] || fail "job $job_id: $state"
kill -TERM "$worker_pid"
wait "$worker_pid" || fail "the example worker did not stop cleanly on SIGTERM"
worker_pid=""
secured_broker_stop
broker_pid=""

echo "== a 3-node cluster: the example worker through a kill -9 of its queue's leader"
(cd "$tmp" && "$repo/tests/lib/cluster_example.sh" "$broker_bin" "$tmp/cluster" "cluster-$$" \
  '{"email": "c{n}@example.com", "name": "C{n}"}' -- "$tmp/bin/worker" -queue "cluster-$$") ||
  fail "the example worker lost jobs in the cluster"
echo "install test: passed (module v$version from its zip, example worker over TLS with a token and through a leader's kill -9 in a 3-node cluster)"
