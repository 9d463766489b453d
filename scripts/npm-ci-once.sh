#!/usr/bin/env bash
# `npm ci` in DIR, skipped when DIR/node_modules was installed from this very package-lock.json
# (a stamp file holds the lock's sha256), so a second test run does not reinstall.
#   scripts/npm-ci-once.sh DIR
set -euo pipefail
dir="$1"
stamp="$dir/node_modules/.installed-from-lock"
want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "npm-ci-once: $dir: node_modules is up to date"
  exit 0
fi
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
echo "$want" >"$stamp"
