#!/usr/bin/env bash
# Installs what bench/peers needs, only what is missing (safe to run every time):
#   - Debian's redis-server (7.0.x on bookworm) and beanstalkd (1.12);
#   - BullMQ and its ioredis, from bench/peers/node/package-lock.json (npm ci).
# The Debian packages may start system services on their default ports (6379, 11300) where
# the machine runs systemd; run.sh never uses those: it starts its own servers on free loopback
# ports with their own data dirs, so a system service neither helps nor gets in the way.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"

missing=()
for p in redis-server beanstalkd; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "peers/install: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

command -v node >/dev/null || { echo "peers/install: node is not on PATH" >&2; exit 1; }
# npm ci wipes and reinstalls node_modules: skip it while the installed tree matches the lock
# file (npm writes node_modules/.package-lock.json, a copy of what it installed).
node_dir="$here/node"
if ! [ -f "$node_dir/node_modules/.package-lock.json" ] ||
   [ "$node_dir/package-lock.json" -nt "$node_dir/node_modules/.package-lock.json" ]; then
  echo "peers/install: npm ci in $node_dir" >&2
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
