#!/usr/bin/env bash
# `make lint`: ruff lint (with import order) and the formatter's check; `--fix` rewrites instead.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_venv
if [ "${1:-}" = "--fix" ]; then
  "$VENV/bin/ruff" check --fix .
  "$VENV/bin/ruff" format .
else
  "$VENV/bin/ruff" check .
  "$VENV/bin/ruff" format --check .
fi
