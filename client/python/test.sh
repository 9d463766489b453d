#!/usr/bin/env bash
# Installs the pinned dev requirements into .venv, builds the jobbroker wheel and sdist into dist/
# (the build hook generates the gRPC stubs from ../../proto, the version is <repo>/VERSION),
# installs the wheel, and runs every test against the real broker ($JOBBROKER_BIN, default
# <repo>/build/server/jobbroker), the sign-up kill test included, and the install test
# (tests/test_install.py: the sdist rebuilds the same wheel; the wheel, in a brand-new venv with
# the pinned run-time dependencies from .venv/wheelhouse, runs examples/ with TLS and a token).
# `test.sh --build-only` stops after installing the package; other arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

python="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv .venv
fi
venv_python="$here/.venv/bin/python"

# Pinned, hash-checked; skipped when the lock file has not changed since the last install.
stamp=.venv/requirements-dev.sha256
want="$(sha256sum requirements-dev.txt | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
  "$venv_python" -m pip install --quiet --disable-pip-version-check --require-hashes \
    -r requirements-dev.txt
  echo "$want" >"$stamp"
fi

# Build the sdist and the wheel with the pinned build backend and grpcio-tools, then install the
# wheel.
rm -rf dist
if ! built="$("$venv_python" -m hatchling build -t sdist -t wheel -d dist 2>&1)"; then
  echo "$built" >&2
  exit 1
fi
"$venv_python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
  dist/jobbroker-*.whl
# --build-only: stop here, with the venv and the freshly built package (bench/workers/run.sh).
if [[ "${1:-}" == "--build-only" ]]; then
  exit 0
fi

# The hand-written code is fully typed (the package ships py.typed): mypy --strict holds it to
# that, against the generated modules' .pyi files. Settings are in pyproject.toml.
"$venv_python" -m mypy src/jobbroker

# The install test's run-time dependencies: the wheels requirements-runtime.txt pins (with
# hashes), downloaded again only when that file changes.
wheelhouse=.venv/wheelhouse
want="$(sha256sum requirements-runtime.txt | cut -d' ' -f1)"
if [[ "$(cat "$wheelhouse/.stamp" 2>/dev/null || true)" != "$want" ]]; then
  rm -rf "$wheelhouse"
  "$venv_python" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
    --only-binary :all: -r requirements-runtime.txt -d "$wheelhouse"
  echo "$want" >"$wheelhouse/.stamp"
fi
export JOBBROKER_PY_DIST="$here/dist" JOBBROKER_PY_WHEELHOUSE="$here/$wheelhouse"

# Run from a folder outside src/ so the tests use the installed wheel.
exec "$venv_python" -m pytest -p no:cacheprovider "$here/tests" "$@"
