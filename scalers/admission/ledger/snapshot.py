"""What admission decides on, read right after the lock: the routing/caps :class:`World` (cached per
config version) and the current :class:`Usage` (SPEC c.2)."""

from __future__ import annotations

import json

from agents.choices import ACTIVE_STATES, AgentState

from ..caps import Usage
from ..matching import WORLD_CACHE, World, build_world
from .lock import _LOCK_SQL, _config_dict, lock_admission
from .rows import dict_rows

_ACTIVE = tuple(str(s) for s in ACTIVE_STATES)

# Any change to a row admission reads (by the importer, the admin, or a raw UPDATE that leaves
# updated_at alone) changes this fingerprint and rebuilds the cached World. A few dozen rows:
# well under a millisecond per batch.
_VERSION_SQL = (
    "SELECT md5(coalesce((SELECT string_agg(t::text, '|' ORDER BY id) FROM scalers_scaler t), '')) "
    "|| md5(coalesce((SELECT string_agg(t::text, '|' ORDER BY id) FROM scalers_labelset t), '')) "
    "|| md5(coalesce((SELECT string_agg(t::text, '|' ORDER BY id) FROM scalers_machinepool t), ''))"
)


def load_world(cursor, config_row: dict, fingerprint: str | None = None) -> World:
    """The routing/caps view for the current config version (cached across batches).

    ``fingerprint``: the rows' fingerprint when the caller already read it (see
    :func:`load_snapshot`), else it is read here."""
    if fingerprint is None:
        cursor.execute(_VERSION_SQL)
        fingerprint = cursor.fetchone()[0]
    version = config_row["version"] + "#" + fingerprint
    world = WORLD_CACHE.get(version)
    if world is not None:
        return world
    scalers = dict_rows(
        cursor,
        "SELECT id, name, type, max_agents, max_concurrent_spawns, max_cpu, max_memory_bytes, machine_pool_id, "
        "mandatory_labels, roles, config, retiring, warm_pool_enabled, warm_pool_size, warm_pool_idle_timeout_seconds "
        "FROM scalers_scaler ORDER BY id",
    )
    # Config order (routing ties and empty runsOn pick the first, SPEC b): the order of the
    # imported file's ``scalers`` list; scalers not in it (retiring, hand-made) after, by id.
    cursor.execute(
        "SELECT coalesce(jsonb_path_query_array(raw, '$.scalers[*].name'), '[]') FROM scalers_configstate WHERE id = 1"
    )
    row = cursor.fetchone()
    order = row[0] if row else []
    if isinstance(order, str):
        order = json.loads(order)
    position = {name: i for i, name in enumerate(order or [])}
    scalers.sort(key=lambda s: (position.get(s["name"], len(position)), s["id"]))
    label_sets = dict_rows(cursor, "SELECT id, scaler_id, index, labels, config, retired FROM scalers_labelset")
    pools = dict_rows(cursor, "SELECT id, max_cpu, max_memory_bytes FROM scalers_machinepool")
    world = build_world(version, config_row, scalers, label_sets, pools)
    WORLD_CACHE.put(world)
    return world


_USAGE_SQL = (
    "SELECT 0, scaler_id, machine_pool_id, count(*), coalesce(sum(cpus), 0)::float8, coalesce(sum(memory_bytes), 0)::int8, "
    "NULL::text FROM scalers_reservation GROUP BY scaler_id, machine_pool_id "
    "UNION ALL "
    "SELECT 1, scaler_id, NULL, count(*), (count(*) FILTER (WHERE state = %(spawning)s))::float8, 0::int8, NULL::text "
    "FROM agents_agent WHERE state = ANY(%(active)s) GROUP BY scaler_id"
)


def _usage_from_rows(rows) -> Usage:
    usage = Usage()
    for kind, scaler_id, pool_id, n, a, b, _ in rows:
        if kind == 2:
            continue
        s = usage.scaler(scaler_id)
        if kind == 0:
            for t in (usage.total, s) + ((usage.pool(pool_id),) if pool_id is not None else ()):
                t.reservations += n
                t.cpus += float(a)
                t.memory_bytes += int(b)
        else:
            for t in (usage.total, s):
                t.active += n
                t.spawning += int(a)
    return usage


_SNAPSHOT_SQL = _USAGE_SQL + " UNION ALL SELECT 2, NULL, NULL, 0, 0::float8, 0::int8, (" + _VERSION_SQL + ")"


def _snapshot_params() -> dict:
    return {"spawning": str(AgentState.SPAWNING), "active": list(_ACTIVE)}


def _fingerprint(rows) -> str:
    """The config rows' fingerprint, carried by the snapshot's kind-2 row."""
    return next(r[6] for r in rows if r[0] == 2)


def lock_and_snapshot(conn) -> tuple[dict, World, Usage]:
    """Lock, then read the snapshot, in ONE round trip (psycopg pipeline mode).

    Both statements are sent together; the server runs the snapshot statement only after the
    locking one returned, and under READ COMMITTED it takes its own snapshot then, so it sees
    everything committed before the lock was granted. ``conn``: the raw psycopg connection,
    inside the caller's transaction.
    """
    import psycopg

    params = _snapshot_params()
    with psycopg.Cursor(conn) as lock_cur, psycopg.Cursor(conn) as snap_cur:
        with conn.pipeline():
            lock_cur.execute(_LOCK_SQL)
            snap_cur.execute(_SNAPSHOT_SQL, params)
        row = lock_cur.fetchone()
        rows = snap_cur.fetchall()
        if row is None:  # never imported: create the row, then lock it the plain way
            config_row = lock_admission(lock_cur)
            snap_cur.execute(_SNAPSHOT_SQL, params)
            rows = snap_cur.fetchall()
        else:
            config_row = _config_dict(row)
        return config_row, load_world(lock_cur, config_row, _fingerprint(rows)), _usage_from_rows(rows)


def load_snapshot(cursor, config_row: dict) -> tuple[World, Usage]:
    """The World and the Usage in one round trip (one statement, one snapshot) after the lock."""
    cursor.execute(_SNAPSHOT_SQL, _snapshot_params())
    rows = cursor.fetchall()
    fingerprint = _fingerprint(rows)
    usage = _usage_from_rows(rows)
    return load_world(cursor, config_row, fingerprint), usage
