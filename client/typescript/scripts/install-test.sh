#!/usr/bin/env bash
# The install test: installs the packed tarball (npm pack's .tgz) into a fresh, empty npm project
# outside the repository, copies examples/worker.mjs (ESM: import) and examples/producer.cjs
# (CommonJS: require) into it, type-checks both module kinds against the installed declarations,
# and runs the two against a real broker with TLS (a throwaway CA made by openssl, a server
# certificate for 127.0.0.1) and a bearer token: the producer enqueues a job, the worker
# completes it. NODE_PATH is unset and the project lives in a temp dir, so only the installed
# package can be imported (checked: both resolutions point into the project's node_modules).
#   scripts/install-test.sh PATH/TO/jobbroker-client-X.Y.Z.tgz
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
tgz="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
bin="${JOBBROKER_BIN:-$root/build/server/jobbroker}"
work="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-ts-install-XXXXXX")"
broker_pid=""
cleanup() {
  if [[ -n "$broker_pid" ]]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
  if [[ -n "${worker_pid:-}" ]]; then kill "$worker_pid" 2>/dev/null || true; wait "$worker_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "install-test: FAIL: $*" >&2
  for f in "$work"/broker/broker.log "$work"/worker.out; do
    [[ -f "$f" ]] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
  done
  exit 1
}

# What the tarball holds: both builds, the declarations, LICENSE, README, package.json.
listing="$(tar -tzf "$tgz")"
for f in package/LICENSE package/README.md package/package.json package/dist/src/index.js \
         package/dist/src/index.d.ts package/dist/src/tracing.js package/dist/esm/index.js \
         package/dist/esm/index.d.ts package/dist/esm/tracing.js package/dist/esm/package.json \
         package/dist/src/testing.js package/dist/esm/testing.js; do
  grep -qx "$f" <<<"$listing" || fail "$f is not in $(basename "$tgz")"
done
! grep -q '^package/dist/test/\|^package/src/' <<<"$listing" || fail "tests or sources in the tarball"
version="$(tr -d '[:space:]' <"$root/VERSION")"
[[ "$(basename "$tgz")" == "jobbroker-client-$version.tgz" ]] || fail "$(basename "$tgz") is not version $version (VERSION)"

# The broker with TLS (a throwaway CA, a certificate for IP 127.0.0.1) and a bearer token.
# shellcheck source=../../../tests/lib/secured_broker.sh
source "$root/tests/lib/secured_broker.sh"
secured_broker_start "$bin" "$work/broker" || fail "the secured broker did not start"
broker_pid="$secured_pid" token="$secured_token"
cp "$secured_ca" "$work/ca.pem"

# The scratch project: nothing but the tarball (and what it depends on, from the registry).
app="$work/app"
mkdir "$app"
printf '{"name": "jobbroker-install-test", "version": "1.0.0", "private": true}\n' >"$app/package.json"
cp "$here/examples/worker.mjs" "$here/examples/producer.cjs" "$app/"
(cd "$app" && npm install --no-audit --no-fund --prefer-offline --loglevel=error "$tgz" >/dev/null)

unset NODE_PATH
cd "$app"
resolved_cjs="$(node -p '["", "/tracing", "/testing"].map((s) => require.resolve("@jobbroker/client" + s)).join(" ")')"
resolved_esm="$(node --input-type=module -e 'console.log(["", "/tracing", "/testing"].map((s) => new URL(import.meta.resolve("@jobbroker/client" + s)).pathname).join(" "))')"
echo "install-test: require -> $resolved_cjs"
echo "install-test: import  -> $resolved_esm"
for p in $resolved_cjs $resolved_esm; do
  [[ "$p" == "$app/node_modules/@jobbroker/client/"* ]] || fail "$p is not the installed package"
done
[[ "$(node -p 'require("@jobbroker/client/package.json").version')" == "$version" ]] || fail "installed version is not $version"

# The declarations, as a CommonJS and an ESM TypeScript user sees them (the client's own tsc and
# @types/node; the package and its dependencies come from the project's node_modules).
cat >check.mts <<'TS'
import { Client, Worker, version, type ClientOptions } from "@jobbroker/client";
import { FakeClient } from "@jobbroker/client/testing";
const o: ClientOptions = { address: "127.0.0.1:1", token: "t" };
const w: Worker<{ to: string }, { sent: string }> = new Worker<{ to: string }, { sent: string }>(o);
w.handle("q", async (job) => ({ sent: job.data.to }));
export const x: [string, typeof Client] = [version, Client];
const fake = new FakeClient();
await fake.enqueue("q", { a: 1 });
export const recorded: number = fake.jobsIn("q").length;
TS
cat >check.cts <<'TS'
import { Client, JobBrokerError, Status } from "@jobbroker/client";
export function f(e: unknown): boolean { return e instanceof JobBrokerError && e.code === Status.UNAVAILABLE && !!Client; }
TS
"$here/node_modules/.bin/tsc" --noEmit --strict --skipLibCheck --module nodenext --moduleResolution nodenext \
  --target es2022 --typeRoots "$here/node_modules/@types" --types node check.mts check.cts || fail "type check"

export JOBBROKER_ADDRESS="$secured_address" JOBBROKER_CA="$work/ca.pem"

# Without the token the broker refuses the producer: the token below is what lets it in.
if JOBBROKER_TOKEN="" timeout 30 node producer.cjs install-test nobody@example.com >/dev/null 2>"$work/refused.err"; then
  fail "a producer without a token was let in"
fi
grep -q UNAUTHENTICATED "$work/refused.err" || fail "no UNAUTHENTICATED without a token: $(cat "$work/refused.err")"

export JOBBROKER_TOKEN="$token"
timeout 60 node worker.mjs install-test --once >"$work/worker.out" 2>&1 &
worker_pid=$!
timeout 60 node producer.cjs install-test ada@example.com || { cat "$work/worker.out" >&2; fail "the producer"; }
wait "$worker_pid" || { cat "$work/worker.out" >&2; fail "the worker exited non-zero"; }
cat "$work/worker.out"
grep -q "^sent .* to ada@example.com .*(jobbroker-typescript/$version)" "$work/worker.out" || fail "the worker did not send"
worker_pid=""
kill "$broker_pid" && wait "$broker_pid" 2>/dev/null
broker_pid=""

echo "install-test: a 3-node cluster: the example worker through a kill -9 of its queue's leader"
unset JOBBROKER_TOKEN JOBBROKER_CA
"$root/tests/lib/cluster_example.sh" "$bin" "$work/cluster" "cluster-$$" '{"to": "c{n}@example.com"}' -- \
  node worker.mjs "cluster-$$" || fail "the example worker lost jobs in the cluster"
echo "install-test: OK: $(basename "$tgz") installed in a scratch project; ESM worker and CommonJS producer over TLS with a token; the worker through a leader's kill -9 in a 3-node cluster"
