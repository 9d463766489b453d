#!/usr/bin/env bash
# Installs the Debian 12 packages jobbroker needs to build and test, only when some are missing.
# Runs as root (CI, containers) or through sudo.
#
#   scripts/install-deps.sh          # what building and running the broker needs
#   scripts/install-deps.sh --tests  # also what the tests of every client language need
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev clang-format
  ccache      # compiles once per source: CMakeLists.txt (JOBBROKER_CCACHE), scripts/image-check.sh
  prometheus  # /usr/bin/prometheus and promtool, for tests/observability
  openssl     # a throwaway CA for the TLS tests
  libssl-dev  # the HTTP endpoint's TLS (server/http/tls_front.cc)
  libjemalloc-dev  # the broker's allocator (CMakeLists.txt: JOBBROKER_JEMALLOC)
  golang-etcd-server-dev  # etcd's .proto files, compiled into cluster/etcd's client at build time
  etcd-server  # /usr/bin/etcd: tests/cluster/real_etcd, the clients' cluster tests, tests/lib/cluster.sh
)
if [ "${1:-}" = "--tests" ]; then
  # The Ruby client is generated with Debian's grpc tools and runs on Debian's grpc gem; its
  # ActiveJob adapter is tested in a minimal Rails app (railties is only recommended by
  # activejob, and recommends are not installed).
  packages+=(ruby ruby-grpc ruby-grpc-tools ruby-activejob ruby-railties)
  # scripts/image-check.sh builds and runs the container image with podman (no Docker engine),
  # on a base image it makes with debootstrap.
  packages+=(podman runc debootstrap curl)
  # The asan suite's build and tests/fuzz are clang's: ASan's and libFuzzer's runtimes come with
  # libclang-rt; llvm-14 has the symbolizer for stacks.
  packages+=(clang-14 libclang-rt-14-dev llvm-14)
  # tests/ui: the dashboard in a real headless browser (driven by playwright-core from npm).
  packages+=(chromium)
  # The other languages' toolchains come with the machine (Go, Node.js with npm, JDK with Maven,
  # Rust with cargo, CPython); their packages are installed from each client's lock file.
  for tool in go node npm java mvn cargo python3; do
    command -v "$tool" >/dev/null || {
      echo "install-deps: '$tool' is not on PATH; the client tests need it (see README.md)" >&2
      exit 1
    }
  done
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
