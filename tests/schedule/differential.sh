#!/usr/bin/env bash
# The differential test of schedule/cron.h against croniter (differential.py says what is
# compared and which differences are explained). Installs croniter's pinned, hash-checked
# requirements into a venv in the build folder, reinstalling only when requirements.txt changes,
# then runs the comparison with a fixed seed.
#
#   tests/schedule/differential.sh <build>/tests/schedule/cron_next [--cases N]
#   SEED=7 tests/schedule/differential.sh ...     # another seed; a failing seed is a test case
#
# BUILD_DIR (ctest sets it) is where the venv goes, as schedule-venv; by default the build folder
# holding the tool. PYTHON picks the interpreter that creates the venv (default python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tool="${1:?usage: differential.sh <path to cron_next> [differential.py options]}"
shift
tool="$(cd "$(dirname "$tool")" && pwd)/$(basename "$tool")"
build_dir="${BUILD_DIR:-$(cd "$(dirname "$tool")/../.." && pwd)}"

venv="$build_dir/schedule-venv"
if [[ ! -x "$venv/bin/python" ]]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes \
    -r "$here/requirements.txt"
  echo "$want" >"$stamp"
fi

# Both sides read the zone rules from the same files: Abseil from TZDIR (default
# /usr/share/zoneinfo), Python's zoneinfo from PYTHONTZPATH rather than the tzdata package.
export PYTHONTZPATH="${TZDIR:-/usr/share/zoneinfo}"
seed="${SEED:-20240310}"
echo "differential: seed $seed (SEED=<n> runs another)"
exec "$venv/bin/python" "$here/differential.py" --tool "$tool" --seed "$seed" "$@"
