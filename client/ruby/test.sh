#!/usr/bin/env bash
# Generates the Ruby gRPC code from ../../proto, builds the gem (with the repository's LICENSE
# and VERSION) and runs the minitest suite against the real broker ($JOBBROKER_BIN, default
# <repo>/build/server/jobbroker); test/gem_install_test.rb installs that gem into a fresh
# GEM_HOME and runs examples/worker.rb from it over TLS with a token.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

# Debian packages (installed by scripts/install-deps.sh; this script installs nothing).
missing=()
command -v ruby >/dev/null || missing+=(ruby)
command -v grpc_tools_ruby_protoc >/dev/null || missing+=(ruby-grpc-tools)
# The cluster tests' etcd (test/cluster_routing_test.rb).
command -v etcd >/dev/null || missing+=(etcd-server)
if command -v ruby >/dev/null; then
  ruby -e 'require "grpc"' 2>/dev/null || missing+=(ruby-grpc)
  ruby -e 'require "minitest"' 2>/dev/null || missing+=(ruby-minitest)
  # The ActiveJob adapter's tests: ActiveJob 6.1, and railties for the minimal Rails app.
  ruby -e 'require "active_job"' 2>/dev/null || missing+=(ruby-activejob)
  ruby -e 'require "rails"' 2>/dev/null || missing+=(ruby-railties)
fi
if ((${#missing[@]})); then
  echo "client/ruby/test.sh: missing Debian package(s): ${missing[*]}" >&2
  echo "  install with: apt-get install -y ${missing[*]}" >&2
  exit 1
fi

export JOBBROKER_BIN="${JOBBROKER_BIN:-$repo/build/server/jobbroker}"
if [[ ! -x "$JOBBROKER_BIN" ]]; then
  echo "client/ruby/test.sh: broker binary not found at $JOBBROKER_BIN (build it or set JOBBROKER_BIN)" >&2
  exit 1
fi

echo "== generating lib/jobbroker/v1 from proto/"
rm -rf lib/jobbroker/v1
grpc_tools_ruby_protoc -I "$repo/proto" --ruby_out=lib --grpc_out=lib \
  "$repo"/proto/jobbroker/v1/*.proto

echo "== building the gem"
# The gem ships the repository's LICENSE and VERSION (the one version of every package).
cp "$repo/LICENSE" LICENSE
cp "$repo/VERSION" lib/jobbroker/VERSION
mkdir -p tmp
rm -f tmp/jobbroker.gem
gem build jobbroker.gemspec -o tmp/jobbroker.gem >tmp/gem-build.log 2>&1 || {
  cat tmp/gem-build.log >&2
  exit 1
}
grep -E '^ *(Name|Version|File):' tmp/gem-build.log
ruby -Ilib -e 'require "jobbroker"; puts "jobbroker #{Jobbroker::VERSION} loads"'
export JOBBROKER_GEM="$here/tmp/jobbroker.gem"

echo "== tests"
ruby -Ilib -Itest -e 'Dir["test/*_test.rb"].sort.each { |f| require File.expand_path(f) }' -- "$@"
