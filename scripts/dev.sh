#!/usr/bin/env bash
# README command #1: from a fresh machine with only python3 + bash to `dg dev`.
#   ./scripts/dev.sh [dg dev args...]      e.g. ./scripts/dev.sh -p 3001 -h 0.0.0.0
# Bootstraps uv if missing, installs the locked environment (uv.lock) into .venv, points
# DAGSTER_HOME at <repo>/.dagster_home (seeded with dagster.yaml.local), generates sample
# data once, then execs `dg dev`: Dagster's local start (`dagster dev` now warns that it
# is superseded by it), loading the code location that [tool.dg] in pyproject.toml names
# (orchestration.definitions as "dueledger", the same as workspace.yaml).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

# uv, then the locked environment (shared with scripts/test.sh).
# shellcheck source=scripts/uv_env.sh
source "$REPO/scripts/uv_env.sh"

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

echo "==> dg dev (DAGSTER_HOME=$DAGSTER_HOME)" >&2
# Started in the background, this shell ignores SIGINT, and Dagster gives SIGTERM SIGINT's
# handler: every process the server starts (a run's compute-log mirror) would then ignore
# the SIGTERM that stops it. Hand `dg dev` the default handling back (GNU env).
if env --default-signal=INT true 2>/dev/null; then
  exec env --default-signal=INT,TERM,QUIT "${UV[@]}" run --frozen dg dev "$@"
fi
exec "${UV[@]}" run --frozen dg dev "$@"
