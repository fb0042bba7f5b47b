#!/usr/bin/env bash
# README command #1: from a fresh machine with only python3 + bash to `dagster dev`.
#   ./scripts/dev.sh [dagster dev args...]      e.g. ./scripts/dev.sh -p 3001 -h 0.0.0.0
# Bootstraps uv if missing, installs the locked environment (uv.lock) into .venv, points
# DAGSTER_HOME at <repo>/.dagster_home (seeded with dagster.yaml.local), generates sample
# data once, then execs `dagster dev -w workspace.yaml`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

# --- uv bootstrap (same in scripts/test.sh) -------------------------------------------
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

export DAGSTER_HOME="$REPO/.dagster_home"
mkdir -p "$DAGSTER_HOME"
if [ ! -e "$DAGSTER_HOME/dagster.yaml" ]; then
  cp "$REPO/dagster.yaml.local" "$DAGSTER_HOME/dagster.yaml"
  echo "==> created $DAGSTER_HOME/dagster.yaml from dagster.yaml.local" >&2
elif ! cmp -s "$REPO/dagster.yaml.local" "$DAGSTER_HOME/dagster.yaml"; then
  echo "==> note: $DAGSTER_HOME/dagster.yaml differs from dagster.yaml.local (kept as is)" >&2
fi

if [ -n "${DUELEDGER_SOURCE_URL:-}" ]; then
  # Custom source store: let the CLI decide (exit 3 = refused because data already exists).
  rc=0
  "${UV[@]}" run --frozen dueledger sample-data || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then exit "$rc"; fi
elif [ ! -e "$DAGSTER_HOME/dueledger_source.sqlite" ]; then
  echo "==> generating sample data" >&2
  "${UV[@]}" run --frozen dueledger sample-data
fi

echo "==> dagster dev (DAGSTER_HOME=$DAGSTER_HOME)" >&2
exec "${UV[@]}" run --frozen dagster dev -w workspace.yaml "$@"
