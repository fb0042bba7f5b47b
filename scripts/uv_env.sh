# Sourced by scripts/dev.sh and scripts/test.sh (expects $REPO): make sure uv exists,
# then install the locked environment (uv.lock) into .venv. Sets the array UV.
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
# --compile-bytecode: every process of the platform (run workers, the daemon, code servers,
# the CLI) imports Dagster; without .pyc files next to the sources -- uv does not write them,
# and PYTHONDONTWRITEBYTECODE keeps Python from caching them -- each one compiles Dagster and
# pandas again: `import dagster` took 2.45 CPU-s instead of about 1. The first sync compiles
# the environment once (about 40 s on 2 cores); later syncs skip what is up to date.
echo "==> uv sync --frozen --compile-bytecode ($("${UV[@]}" --version))" >&2
"${UV[@]}" sync --frozen --compile-bytecode
