#!/usr/bin/env bash
# `make check [CONFIG=path]`: validate a scalers.yaml (and KICI_SCALER_CONFIG_DIR drop-ins) without applying it.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_venv
load_env
exec "$VENV/bin/python" manage.py import_scalers "${1:-${KICI_SCALER_CONFIG_PATH:-examples/scalers.yaml}}" \
  ${KICI_SCALER_CONFIG_DIR:+--dir "$KICI_SCALER_CONFIG_DIR"} --check
