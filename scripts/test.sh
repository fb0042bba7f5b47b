#!/usr/bin/env bash
# README command #2 (CI runs exactly this, through .ci/run): the whole suite.
#   ./scripts/test.sh [pytest args...]          e.g. ./scripts/test.sh tests/orchestration -q
# Bootstraps uv if missing, installs the locked environment, installs the PostgreSQL server,
# chromium (browser tests), prometheus (promtool, for the alert rules' tests) and iproute2
# (network-namespace tests) from Debian packages when they are missing and we are root,
# then runs ruff (lint + format check), mypy and pytest. Every step runs; the exit status
# is non-zero if any failed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

# uv, then the locked environment (shared with scripts/dev.sh).
# shellcheck source=scripts/uv_env.sh
source "$REPO/scripts/uv_env.sh"

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

# The browser tests (tests/browser) drive the Dagster UI with Playwright and Debian's
# chromium (Playwright's own browser download cannot work here). Install it here, not from
# inside the tests, when we can; without it those tests fail saying so.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "==> chromium not found: installing it (apt-get install chromium)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update </dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y chromium </dev/null
  else
    echo "==> warning: chromium not found and not root: the browser tests will fail" \
      "(install chromium, or deselect them with -m 'not browser')" >&2
  fi
fi

# The alert rules (deploy/prometheus) are tested with `promtool test rules`; Debian's
# `prometheus` package ships promtool. Installed without recommends (no node exporter), and
# without letting the package start its Prometheus service: a server scraping in the
# background would only compete with the tests for the cores (policy-rc.d 101 = do not start).
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "==> promtool not found: installing it (apt-get install prometheus)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update </dev/null
    policy_made=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
      policy_made=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus </dev/null
    if [ -n "$policy_made" ]; then rm -f /usr/sbin/policy-rc.d; fi
  else
    echo "==> warning: promtool not found and not root: tests/deploy/test_monitoring.py will" \
      "fail (install prometheus, or deselect it)" >&2
  fi
fi

# The network-namespace tests (tests/deploy/test_netns_topology.py, marker `cluster`) make
# their machines with `ip netns` (iproute2), as root. Install it here when missing and root.
if ! command -v ip >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "==> ip (iproute2) not found: installing it (apt-get install iproute2)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update </dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y iproute2 </dev/null
  else
    echo "==> warning: ip (iproute2) not found and not root: the network-namespace tests" \
      "will fail (run as root, or deselect them with -m 'not cluster')" >&2
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
