#!/usr/bin/env bash
# Install test of the Rust client, as a user of the published crate gets it (test.sh runs it).
#   1. checks that Cargo.toml's version is the root VERSION and LICENSE a copy of the root one;
#   2. `cargo package` makes target/package/jobbroker-<version>.crate (build.rs compiles the
#      crate's own proto/ copy, so the .crate needs nothing from the repository), and checks it
#      holds LICENSE and the protos;
#   3. unpacks it into a temp dir outside the repository and makes a scratch cargo project there
#      with a path dependency on the unpacked crate (offline, Cargo.lock copied from here so the
#      versions are the locked ones; CARGO_TARGET_DIR is client/rust/target so compiled
#      dependencies are reused), copies the crate's example worker and producer into it and
#      builds them; proves the jobbroker package comes from the unpacked crate;
#   4. starts the real broker with TLS (a throwaway CA, a certificate for IP 127.0.0.1) and
#      tokens, runs the example worker with --ca and $JOBBROKER_TOKEN, and the example producer
#      enqueues a job and waits until the worker has completed it; without the token the
#      enqueue is refused.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
broker_bin="${JOBBROKER_BIN:-$repo/build/server/jobbroker}"
version="$(tr -d '[:space:]' <"$repo/VERSION")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

tmp="$(mktemp -d)"
broker_pid="" worker_pid=""
cleanup() {
  [[ -n "$worker_pid" ]] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  [[ -n "$broker_pid" ]] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
  rm -rf "$tmp" "$here/proto"
}
trap cleanup EXIT
fail() {
  echo "install test: $*" >&2
  for f in "$tmp"/broker/broker.log "$tmp"/worker.log; do [[ -f "$f" ]] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
  exit 1
}

echo "== version and LICENSE"
crate_version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/Cargo.toml" | head -n1)"
[[ "$crate_version" == "$version" ]] || fail "Cargo.toml has version $crate_version, VERSION says $version"
cmp -s "$repo/LICENSE" "$here/LICENSE" || fail "client/rust/LICENSE is not a copy of the root LICENSE"

echo "== cargo package"
# The .crate carries the protos build.rs compiles: copied in for the packaging only (git ignores
# client/rust/proto/; build.rs compiles ../../proto when the copy is absent).
rm -rf "$here/proto"
mkdir -p "$here/proto/jobbroker/v1"
cp "$repo"/proto/jobbroker/v1/*.proto "$here/proto/jobbroker/v1/"
# --no-verify: step 3 builds the unpacked .crate itself (cargo's own verify would compile every
# dependency again in a target dir of its own). --allow-dirty: the work tree may hold
# uncommitted changes (the .crate holds the files as they are).
(cd "$here" && cargo package --locked --offline --no-verify --allow-dirty --quiet 2>&1 |
  grep -v "^warning: ignoring test" || true)
rm -rf "$here/proto"
crate="$CARGO_TARGET_DIR/package/jobbroker-$version.crate"
[[ -f "$crate" ]] || fail "cargo package made no $crate"
listing="$(tar tzf "$crate")"
for f in LICENSE Cargo.toml build.rs README.md examples/worker.rs examples/producer.rs \
  proto/jobbroker/v1/broker.proto proto/jobbroker/v1/steps.proto src/lib.rs; do
  grep -qx "jobbroker-$version/$f" <<<"$listing" || fail "$f is not in $crate"
done
echo "$crate: $(wc -l <<<"$listing") files"

echo "== a scratch project depends on the unpacked crate"
mkdir -p "$tmp/unpacked" "$tmp/app/src/bin"
tar xzf "$crate" -C "$tmp/unpacked"
unpacked="$tmp/unpacked/jobbroker-$version"
cp "$unpacked/examples/worker.rs" "$unpacked/examples/producer.rs" "$tmp/app/src/bin/"
cp "$here/Cargo.lock" "$tmp/app/Cargo.lock"
cat >"$tmp/app/Cargo.toml" <<TOML
[package]
name = "install-test"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
jobbroker = { path = "$unpacked" }
tokio = { version = "1.54.1", features = ["macros", "rt", "rt-multi-thread", "signal", "sync", "time"] }

[workspace]
TOML
(
  cd "$tmp/app"
  cargo build --offline --quiet --bins 2>&1 || exit 1
  # The jobbroker package is the unpacked .crate, nothing from the source tree.
  source="$(cargo pkgid --offline jobbroker)"
  [[ "$source" == "path+file://$unpacked#"* ]] || { echo "jobbroker comes from $source" >&2; exit 1; }
  echo "package jobbroker $version from $source"
) || fail "the scratch project does not build"
bin="$CARGO_TARGET_DIR/debug"

echo "== TLS and tokens"
# shellcheck source=../../tests/lib/secured_broker.sh
source "$repo/tests/lib/secured_broker.sh"
secured_broker_start "$broker_bin" "$tmp/broker" || fail "the secured broker did not start"
broker_pid="$secured_pid" addr="$secured_address" token="$secured_token"
cp "$secured_ca" "$tmp/ca.pem"
echo "broker at $addr (TLS, tokens)"

echo "== the example worker completes a job"
queue="install-$$"
(cd "$tmp" && JOBBROKER_TOKEN="$token" exec "$bin/worker" --address "$addr" --ca "$tmp/ca.pem" \
  --queue "$queue" >"$tmp/worker.log" 2>&1) &
worker_pid=$!
# Without the token the broker refuses (proof that tokens are on).
if (cd "$tmp" && JOBBROKER_TOKEN="" "$bin/producer" --address "$addr" --ca "$tmp/ca.pem" --queue "$queue" \
  hello >"$tmp/refused.log" 2>&1); then
  fail "an enqueue without the token was accepted"
fi
grep -qiE "unauthenticated|authentication credentials" "$tmp/refused.log" || fail "enqueue without token: $(cat "$tmp/refused.log")"
out="$(cd "$tmp" && JOBBROKER_TOKEN="$token" "$bin/producer" --address "$addr" --ca "$tmp/ca.pem" \
  --queue "$queue" --timeout-secs 30 "hello from the crate" 2>&1)" || fail "the example producer failed: $out"
echo "$out"
[[ "$out" == *" completed: HELLO FROM THE CRATE" ]] || fail "unexpected producer output: $out"
kill -TERM "$worker_pid"
wait "$worker_pid" || fail "the example worker did not stop cleanly on SIGTERM"
worker_pid=""
secured_broker_stop
broker_pid=""

echo "== a 3-node cluster: the example worker through a kill -9 of its queue's leader"
(cd "$tmp" && "$repo/tests/lib/cluster_example.sh" "$broker_bin" "$tmp/cluster" "cluster-$$" \
  'hello {n}' -- "$bin/worker" --queue "cluster-$$") || fail "the example worker lost jobs in the cluster"
echo "install test: passed (jobbroker $version from its .crate, example worker over TLS with a token and through a leader's kill -9 in a 3-node cluster)"
