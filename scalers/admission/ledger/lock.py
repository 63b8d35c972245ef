"""The admission lock and the global config row (SPEC c.2); see :mod:`scalers.admission.ledger`."""

from __future__ import annotations

import json

# The global config row and its version (everything admission-relevant in it, fingerprinted).
_CONFIG_SQL = (
    "SELECT global_max_agents, global_max_cpu, global_max_memory_bytes, defaults, "
    "coalesce(imported_at::text, '') || '|' || global_max_agents || '|' || coalesce(global_max_cpu::text, '') "
    "|| '|' || coalesce(global_max_memory_bytes::text, '') || '|' || md5(defaults::text) || md5(raw::text) "
    "FROM scalers_configstate WHERE id = 1"
)
_LOCK_SQL = _CONFIG_SQL + " FOR UPDATE"


class ConfigMissing(Exception):
    """No ``ConfigState`` row and none could be created (should not happen)."""


def read_config(cursor) -> dict:
    """The global config row without locking (metrics, pages); defaults when never imported."""
    cursor.execute(_CONFIG_SQL)
    row = cursor.fetchone()
    if row is None:
        return {
            "global_max_agents": 50,
            "global_max_cpu": None,
            "global_max_memory_bytes": None,
            "defaults": {},
            "version": "none",
        }
    return _config_dict(row)


def _config_dict(row) -> dict:
    """The config row (a :data:`_CONFIG_SQL` result) as the dict admission reads."""
    defaults = row[3]
    if isinstance(defaults, str):
        defaults = json.loads(defaults)
    return {
        "global_max_agents": row[0],
        "global_max_cpu": row[1],
        "global_max_memory_bytes": row[2],
        "defaults": defaults,
        "version": row[4],
    }


def lock_admission(cursor) -> dict:
    """Take the admission lock; return the global config row as a dict.

    Creates the singleton row (defaults: ``globalMaxAgents`` 50, no resource caps) when the
    config was never imported, then locks it. Blocks until the lock is granted.
    """
    sql = _LOCK_SQL
    cursor.execute(sql)
    row = cursor.fetchone()
    if row is None:
        cursor.execute(
            "INSERT INTO scalers_configstate (id, global_max_agents, defaults, firecracker, source, raw) "
            "VALUES (1, 50, '{}', '{}', '', '{}') ON CONFLICT (id) DO NOTHING"
        )
        cursor.execute(sql)
        row = cursor.fetchone()
        if row is None:  # pragma: no cover
            raise ConfigMissing("scalers_configstate row 1 could not be created")
    return _config_dict(row)
