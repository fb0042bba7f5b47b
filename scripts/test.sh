#!/usr/bin/env bash
# README command #2 (CI runs exactly this, through .ci/run): the whole suite.
#   ./scripts/test.sh [pytest args...]          e.g. ./scripts/test.sh tests/orchestration -q
# Bootstraps uv if missing, installs the locked environment, installs the PostgreSQL server
# from Debian packages when it is missing and we are root, then runs ruff (lint + format
# check), mypy and pytest. Every step runs; the exit status is non-zero if any failed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

# --- uv bootstrap (same in scripts/dev.sh) --------------------------------------------
# No Python toolchain downloads: use the machine's Python 3.11 (a download cannot work here
# and would only hide a missing interpreter behind a long wait).
export UV_PYTHON_DOWNLOADS="${UV_PYTHON_DOWNLOADS:-never}"
UV=()
find_uv() {
  if command -v uv >/dev/null 2>&1; then UV=(uv); return 0; fi
  if python3 -m uv --version >/dev/null 2>&1; then UV=(python3 -m uv); return 0; fi
  if [ -x "$REPO/.uv-bootstrap/bin/uv" ]; then UV=("$REPO/.uv-bootstrap/bin/uv"); return 0; fi
  return 1
}
ensure_uv() {
  find_uv && return 0
  echo "==> uv not found: installing it with pip" >&2
  # pip may put the `uv` script off PATH: find_uv falls back to `python3 -m uv`.
  python3 -m pip install --user --quiet uv >&2 && find_uv && return 0
  python3 -m pip install --quiet uv >&2 && find_uv && return 0
  # Externally managed Pythons (PEP 668) refuse both: use a private bootstrap venv.
  python3 -m venv "$REPO/.uv-bootstrap" >&2 \
    && "$REPO/.uv-bootstrap/bin/python" -m pip install --quiet uv >&2 && find_uv && return 0
  python3 -m pip install --user --break-system-packages --quiet uv >&2 && find_uv && return 0
  echo "error: could not install uv (tried pip --user, pip, a bootstrap venv)" >&2
  exit 1
}
ensure_uv
echo "==> uv sync --frozen ($("${UV[@]}" --version))" >&2
"${UV[@]}" sync --frozen
# ---------------------------------------------------------------------------------------

# The throwaway PostgreSQL server used by the tests (tests/pg_server.py) needs initdb,
# pg_ctl and postgres. Install them here, not from inside the tests, when we can.
if ! "${UV[@]}" run --frozen python tests/pg_server.py bindir >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "==> PostgreSQL server not found: installing it (apt-get install postgresql)" >&2
    "${UV[@]}" run --frozen python tests/pg_server.py ensure
  else
    echo "==> warning: PostgreSQL server binaries not found and not root: the postgres" \
      "tests will fail (install postgresql, or deselect them with -m 'not postgres')" >&2
  fi
fi

failed=()
step() {
  local name="$1"
  shift
  echo "==> $name: $*" >&2
  if ! "$@"; then
    failed+=("$name")
    echo "==> $name FAILED" >&2
  fi
}
step "ruff check" "${UV[@]}" run --frozen ruff check .
step "ruff format" "${UV[@]}" run --frozen ruff format --check .
step "mypy" "${UV[@]}" run --frozen mypy
step "pytest" "${UV[@]}" run --frozen pytest "$@"

if [ "${#failed[@]}" -gt 0 ]; then
  echo "==> FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "==> all checks passed" >&2
