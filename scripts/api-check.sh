#!/usr/bin/env bash
# API hygiene for proto/: buf lint, buf format, and buf breaking against the last released API
# (api/jobbroker-v1.json, a buf image written when the API was tagged; see docs/decisions.md).
# A change that would break clients built against that release fails here.
#
#   scripts/api-check.sh            # the checks (CI)
#   scripts/api-check.sh --release  # rewrite the baseline from proto/ (when tagging an API release)
set -euo pipefail
cd "$(dirname "$0")/.."
buf="$(scripts/install-buf.sh)"
baseline=api/jobbroker-v1.json

if [ "${1:-}" = "--release" ]; then
  "$buf" build --exclude-source-info -o "$baseline"
  echo "api-check: wrote $baseline"
  exit 0
fi

passed=0
failed=0
check() {
  local name="$1"
  shift
  if "$@"; then
    echo "ok: $name"
    passed=$((passed + 1))
  else
    echo "FAIL: $name"
    failed=$((failed + 1))
  fi
}

check "buf lint" "$buf" lint
check "buf format" "$buf" format -d --exit-code proto
check "buf breaking against $baseline" "$buf" breaking --against "$baseline"

# The breaking check must be able to fail: renumbering a field of the released API is refused.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp -r proto buf.yaml "$scratch/"
sed -i 's/bool deduplicated = 2;/bool deduplicated = 3;/' "$scratch/proto/jobbroker/v1/broker.proto"
refused() { ! (cd "$scratch" && "$buf" breaking --against "$OLDPWD/$baseline" >/dev/null 2>&1); }
check "buf breaking refuses a renumbered field" refused

echo "api-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
