#!/usr/bin/env bash
# Ruby needs no build; the generated gRPC code (client/ruby/test.sh makes it) must be there.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib="$(cd "$here/../../../client/ruby/lib" && pwd)"
for f in broker_pb broker_services_pb admin_pb admin_services_pb job_pb policy_pb steps_pb; do
  if [[ ! -f "$lib/jobbroker/v1/$f.rb" ]]; then
    echo "tests/interop/ruby/build.sh: $lib/jobbroker/v1/$f.rb missing (run client/ruby/test.sh)" >&2
    exit 1
  fi
done
ruby -I "$lib" -e 'require "jobbroker"' || {
  echo "tests/interop/ruby/build.sh: the jobbroker library does not load" >&2
  exit 1
}
