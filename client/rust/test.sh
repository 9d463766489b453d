#!/usr/bin/env bash
# Builds the Rust client and runs its tests against the real broker binary
# ($JOBBROKER_BIN, default <repo>/build/server/jobbroker). Needs rustup's cargo and protoc
# (Debian protobuf-compiler; $PROTOC is respected).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

installed="$(rustup component list --installed 2>/dev/null || true)"
if grep -q '^rustfmt' <<<"$installed"; then
  echo "== cargo fmt --check"
  cargo fmt --check
else
  echo "== rustfmt not installed: skipping cargo fmt --check"
fi

echo "== cargo build"
# --all-targets also builds examples/worker, which tests/worker_example.rs runs. Without the
# optional features first: the crate must build without OpenTelemetry.
cargo build --locked -j2 --all-targets
cargo build --locked -j2 --all-targets --features tracing-otel

if grep -q '^clippy' <<<"$installed"; then
  echo "== cargo clippy"
  cargo clippy --locked -j2 --all-targets -- -D warnings
  cargo clippy --locked -j2 --all-targets --features tracing-otel -- -D warnings
else
  echo "== clippy not installed: skipping cargo clippy"
fi

echo "== cargo test (doc tests: the README's snippets compile)"
cargo test --locked -j2 --doc --features tracing-otel
echo "== cargo test (integration tests against the real broker)"
cargo test --locked -j2 --lib --tests --features tracing-otel
echo "== install test (cargo package, the .crate in a scratch project, example worker over TLS with a token)"
./install_test.sh
