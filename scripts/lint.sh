#!/usr/bin/env bash
# `make lint`: ruff lint (with import order) and the formatter's check, then mypy over the
# production packages (pyproject's [tool.mypy], with the Django plugin); `--fix` lets ruff rewrite.
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
# Without a cache: the plugin's view of the settings' types is not invalidated by an incremental run.
SECRET_KEY="${SECRET_KEY:-lint-only-not-secret}" "$VENV/bin/mypy" --no-incremental
