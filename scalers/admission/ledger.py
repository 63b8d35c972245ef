"""Database side of admission: the lock, the usage snapshot, and writing a decided batch.

Every function here runs inside the caller's transaction on the caller's connection
(:mod:`scalers.admission.decide` opens it). SQL is written out because these few statements run
once per *batch* on the hot path; everything else uses the ORM.

The lock (SPEC c.2 "under one mutex", shared by every console process on the database):
``SELECT ... FROM scalers_configstate WHERE id = 1 FOR UPDATE``. Chosen over a transaction-level
advisory lock because the same statement returns the global caps, and because a config import
that updates that row is serialised with admission for free. Reads that follow the lock are
separate statements, so under READ COMMITTED they see every transaction committed before the
lock was granted (a sub-select in the locking statement would keep its pre-wait snapshot).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from agents.choices import ACTIVE_STATES, AgentState

from .caps import Tally, Usage
from .matching import WORLD_CACHE, World, build_world

_ACTIVE = tuple(str(s) for s in ACTIVE_STATES)


class ConfigMissing(Exception):
    """No ``ConfigState`` row and none could be created (should not happen)."""


def read_config(cursor) -> dict:
    """The global config row without locking (metrics, pages); defaults when never imported."""
    cursor.execute(
        "SELECT global_max_agents, global_max_cpu, global_max_memory_bytes, defaults, "
        "coalesce(imported_at::text, '') || '|' || global_max_agents || '|' || coalesce(global_max_cpu::text, '') "
        "|| '|' || coalesce(global_max_memory_bytes::text, '') || '|' || md5(defaults::text) || md5(raw::text) "
        "FROM scalers_configstate WHERE id = 1"
    )
    row = cursor.fetchone()
    if row is None:
        return {"global_max_agents": 50, "global_max_cpu": None, "global_max_memory_bytes": None, "defaults": {}, "version": "none"}
    defaults = json.loads(row[3]) if isinstance(row[3], str) else row[3]
    return {"global_max_agents": row[0], "global_max_cpu": row[1], "global_max_memory_bytes": row[2], "defaults": defaults, "version": row[4]}


def lock_admission(cursor) -> dict:
    """Take the admission lock; return the global config row as a dict.

    Creates the singleton row (defaults: ``globalMaxAgents`` 50, no resource caps) when the
    config was never imported, then locks it. Blocks until the lock is granted.
    """
    sql = (
        "SELECT global_max_agents, global_max_cpu, global_max_memory_bytes, defaults, "
        "coalesce(imported_at::text, '') || '|' || global_max_agents || '|' || coalesce(global_max_cpu::text, '') "
        "|| '|' || coalesce(global_max_memory_bytes::text, '') || '|' || md5(defaults::text) || md5(raw::text) "
        "FROM scalers_configstate WHERE id = 1 FOR UPDATE"
    )
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


# Any change to a row admission reads (by the importer, the admin, or a raw UPDATE that leaves
# updated_at alone) changes this fingerprint and rebuilds the cached World. A few dozen rows:
# well under a millisecond per batch.
_VERSION_SQL = (
    "SELECT md5(coalesce((SELECT string_agg(t::text, '|' ORDER BY id) FROM scalers_scaler t), '')) "
    "|| md5(coalesce((SELECT string_agg(t::text, '|' ORDER BY id) FROM scalers_labelset t), '')) "
    "|| md5(coalesce((SELECT string_agg(t::text, '|' ORDER BY id) FROM scalers_machinepool t), ''))"
)


def _rows(cursor, sql: str, params=()) -> list[dict]:
    cursor.execute(sql, params)
    cols = [c[0] for c in cursor.description]
    out = []
    for r in cursor.fetchall():
        d = dict(zip(cols, r))
        for k, v in d.items():
            if k in ("config", "labels", "mandatory_labels", "roles") and isinstance(v, str):
                d[k] = json.loads(v)
        out.append(d)
    return out


def load_world(cursor, config_row: dict) -> World:
    """The routing/caps view for the current config version (cached across batches)."""
    cursor.execute(_VERSION_SQL)
    version = config_row["version"] + "#" + cursor.fetchone()[0]
    world = WORLD_CACHE.get(version)
    if world is not None:
        return world
    scalers = _rows(
        cursor,
        "SELECT id, name, type, max_agents, max_concurrent_spawns, max_cpu, max_memory_bytes, machine_pool_id, "
        "mandatory_labels, roles, config, retiring, warm_pool_enabled, warm_pool_size, warm_pool_idle_timeout_seconds "
        "FROM scalers_scaler ORDER BY id",
    )
    # Config order (routing ties and empty runsOn pick the first, SPEC b): the order of the
    # imported file's ``scalers`` list; scalers not in it (retiring, hand-made) after, by id.
    cursor.execute("SELECT coalesce(jsonb_path_query_array(raw, '$.scalers[*].name'), '[]') FROM scalers_configstate WHERE id = 1")
    row = cursor.fetchone()
    order = row[0] if row else []
    if isinstance(order, str):
        order = json.loads(order)
    position = {name: i for i, name in enumerate(order or [])}
    scalers.sort(key=lambda s: (position.get(s["name"], len(position)), s["id"]))
    label_sets = _rows(cursor, "SELECT id, scaler_id, index, labels, config, retired FROM scalers_labelset")
    pools = _rows(cursor, "SELECT id, max_cpu, max_memory_bytes FROM scalers_machinepool")
    world = build_world(version, config_row, scalers, label_sets, pools)
    WORLD_CACHE.put(world)
    return world


def load_usage(cursor) -> Usage:
    """Usage derived from the reservation rows and the active agents (never a stored counter)."""
    cursor.execute(
        "SELECT 0, scaler_id, machine_pool_id, count(*), coalesce(sum(cpus), 0), coalesce(sum(memory_bytes), 0) "
        "FROM scalers_reservation GROUP BY scaler_id, machine_pool_id "
        "UNION ALL "
        "SELECT 1, scaler_id, NULL, count(*), count(*) FILTER (WHERE state = %s), 0 "
        "FROM agents_agent WHERE state = ANY(%s) GROUP BY scaler_id",
        [str(AgentState.SPAWNING), list(_ACTIVE)],
    )
    usage = Usage()
    for kind, scaler_id, pool_id, n, a, b in cursor.fetchall():
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


def existing_agent_ids(cursor, agent_ids: list[str]) -> set[str]:
    """Which of ``agent_ids`` already exist (an 8-hex id space collides at ~10^5 agents)."""
    if not agent_ids:
        return set()
    cursor.execute("SELECT agent_id FROM agents_agent WHERE agent_id = ANY(%s)", [agent_ids])
    return {r[0] for r in cursor.fetchall()}


def idle_warm_agents(cursor, scaler_ids: Iterable[int]) -> list[dict]:
    """Idle warm agents (running, warm, unbound, no active jobs) of ``scaler_ids``, oldest first,
    with their reservation shape."""
    ids = list(scaler_ids)
    if not ids:
        return []
    return _rows(
        cursor,
        "SELECT a.id, a.agent_id, a.scaler_id, a.label_set_id, r.cpus, r.memory_bytes, r.limit_cpus, r.limit_memory_bytes "
        "FROM agents_agent a JOIN scalers_reservation r ON r.agent_id = a.id "
        "WHERE a.warm AND a.state = %s AND a.bound_job_id = '' AND a.active_jobs = 0 AND a.scaler_id = ANY(%s) "
        "ORDER BY a.registered_at NULLS LAST, a.id",
        [str(AgentState.RUNNING), ids],
    )


def bind_warm_agent(cursor, agent_pk: int, job_id: str, run_id: str) -> bool:
    """Compare-and-swap an idle warm agent onto a job; False if it stopped being idle."""
    cursor.execute(
        "UPDATE agents_agent SET bound_job_id = %s, run_id = %s, updated_at = now() "
        "WHERE id = %s AND state = %s AND bound_job_id = '' AND active_jobs = 0",
        [job_id, run_id, agent_pk, str(AgentState.RUNNING)],
    )
    return cursor.rowcount == 1


def upsert_scale_requests(cursor, rows: list[dict], instance_id: str, now) -> None:
    """Record the latest decision per job (one row per job id; ``attempts`` counts requests)."""
    if not rows:
        return
    latest: dict[str, dict] = {}
    counts: dict[str, int] = {}
    for r in rows:
        latest[r["job_id"]] = r
        counts[r["job_id"]] = counts.get(r["job_id"], 0) + 1
    rows = list(latest.values())
    cols = ["job_id", "run_id", "labels", "resources", "cpus", "memory_bytes", "outcome", "cap", "reason", "scaler_name", "agent_ref"]
    arrays = {c: [] for c in cols}
    attempts = []
    for r in rows:
        for c in cols:
            v = r.get(c)
            if c in ("labels", "resources"):
                v = None if v is None else json.dumps(v)
            arrays[c].append(v)
        attempts.append(counts[r["job_id"]])
    cursor.execute(
        "INSERT INTO scalers_scalerequest (job_id, run_id, labels, resources, cpus, memory_bytes, outcome, cap, reason, "
        "scaler_name, agent_ref, attempts, owner_instance, first_requested_at, decided_at) "
        "SELECT j, r, l::jsonb, res::jsonb, c, m, o, cap, reason, s, a, n, %s, %s, %s FROM unnest("
        "%s::text[], %s::text[], %s::text[], %s::text[], %s::float8[], %s::int8[], %s::text[], %s::text[], %s::text[], "
        "%s::text[], %s::text[], %s::int4[]) AS u(j, r, l, res, c, m, o, cap, reason, s, a, n) "
        "ON CONFLICT (job_id) DO UPDATE SET run_id = EXCLUDED.run_id, labels = EXCLUDED.labels, "
        "resources = EXCLUDED.resources, cpus = EXCLUDED.cpus, memory_bytes = EXCLUDED.memory_bytes, "
        "outcome = EXCLUDED.outcome, cap = EXCLUDED.cap, reason = EXCLUDED.reason, scaler_name = EXCLUDED.scaler_name, "
        "agent_ref = EXCLUDED.agent_ref, attempts = scalers_scalerequest.attempts + EXCLUDED.attempts, "
        "owner_instance = EXCLUDED.owner_instance, decided_at = EXCLUDED.decided_at",
        [instance_id, now, now] + [arrays[c] for c in cols] + [attempts],
    )


def label_key(labels: dict) -> str:
    """Canonical ``k=v,k=v`` (sorted) rendering of a label dict, the counter row key."""
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def increment_counters(cursor, increments: dict[tuple[str, str], tuple[dict, float]]) -> None:
    """Add to :class:`scalers.models.MetricCounter` rows: ``{(name, label_key): (labels, amount)}``."""
    if not increments:
        return
    names, keys, labels, amounts = [], [], [], []
    for (name, key), (lab, amount) in increments.items():
        names.append(name)
        keys.append(key)
        labels.append(json.dumps(lab))
        amounts.append(float(amount))
    cursor.execute(
        "INSERT INTO scalers_metriccounter (name, label_key, labels, value) "
        "SELECT n, k, l::jsonb, v FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[]) AS u(n, k, l, v) "
        "ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value",
        [names, keys, labels, amounts],
    )


def add_to_counters(increments: dict[tuple[str, str], tuple[dict, float]]) -> None:
    """:func:`increment_counters` on the current connection (own statement, autocommit or not)."""
    from django.db import connection

    with connection.cursor() as cur:
        increment_counters(cur, increments)


def counter_increment(name: str, labels: dict, amount: float = 1.0) -> dict[tuple[str, str], tuple[dict, float]]:
    """One increment in the shape :func:`increment_counters` takes."""
    return {(name, label_key(labels)): (labels, amount)}
