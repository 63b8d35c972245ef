"""Database side of admission: the lock, the usage snapshot, idle warm agents, metric counters
and writing a decided batch.

Every function here runs inside the caller's transaction on the caller's connection
(:mod:`scalers.admission.decide` opens it). SQL is written out because these few statements run
once per *batch* on the hot path; everything else uses the ORM.

The lock (one mutex shared by every console process on the database):
``SELECT ... FROM scalers_configstate WHERE id = 1 FOR UPDATE``. Chosen over a transaction-level
advisory lock because the same statement returns the global caps, and because a config import
that updates that row is serialised with admission for free. Reads that follow the lock are
separate statements, so under READ COMMITTED they see every transaction committed before the
lock was granted (a sub-select in the locking statement would keep its pre-wait snapshot).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import psycopg
from django.db import connection, transaction

from agents.choices import ACTIVE_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import Agent
from scalers.models import Reservation, ScaleOutcome

from .caps import Usage
from .matching import WORLD_CACHE, World, build_world

# --------------------------------------------------------------------------- query rows


def dict_rows(cursor, sql: str, params=()) -> list[dict]:
    """Run ``sql`` and return its rows as ``{column: value}``; the JSON columns admission reads
    (``config``, ``labels``, ``mandatory_labels``, ``roles``, ``host_tools_missing``) are decoded when
    they come back as text."""
    cursor.execute(sql, params)
    cols = [c[0] for c in cursor.description]
    out = []
    for r in cursor.fetchall():
        d = dict(zip(cols, r, strict=True))
        for k, v in d.items():
            if k in ("config", "labels", "mandatory_labels", "roles", "host_tools_missing") and isinstance(v, str):
                d[k] = json.loads(v)
        out.append(d)
    return out


# --------------------------------------------------------------------------- prepared statements

#: The ``prepare_threshold`` admission sets on a connection Django opened with prepared statements
#: off (``None``): so high that only the statements run with ``prepare=True`` (the lock, the
#: snapshot, the batch write) are prepared; Django's own queries stay unprepared as before.
ONLY_EXPLICIT = 2**31


def allow_prepared(conn) -> None:
    """Let ``conn`` (a raw psycopg connection) prepare the statements admission runs with
    ``prepare=True``: psycopg ignores the flag while ``prepare_threshold`` is None, so each batch
    would parse and plan its statements again (most of a small batch's server time)."""
    if conn.prepare_threshold is None:
        conn.prepare_threshold = ONLY_EXPLICIT


# --------------------------------------------------------------------------- the lock and the config row

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


# --------------------------------------------------------------------------- metric counters


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
    with connection.cursor() as cur:
        increment_counters(cur, increments)


def counter_increment(name: str, labels: dict, amount: float = 1.0) -> dict[tuple[str, str], tuple[dict, float]]:
    """One increment in the shape :func:`increment_counters` takes."""
    return {(name, label_key(labels)): (labels, amount)}


# --------------------------------------------------------------------------- idle warm agents


def idle_warm_agents(cursor, scaler_ids: Iterable[int]) -> list[dict]:
    """Idle warm agents (running, warm, unbound, no active jobs) of ``scaler_ids``, oldest first,
    with their reservation shape."""
    ids = list(scaler_ids)
    if not ids:
        return []
    return dict_rows(
        cursor,
        "SELECT a.id, a.agent_id, a.scaler_id, a.label_set_id, r.cpus, r.memory_bytes, "
        "r.limit_cpus, r.limit_memory_bytes "
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


# --------------------------------------------------------------------------- World and Usage after the lock

_ACTIVE = tuple(str(s) for s in ACTIVE_STATES)

#: The routing rows' fingerprint: the ``ConfigGeneration`` token, which every statement writing a
#: scaler, label set or machine pool changes (by the importer, the sweeper, a raw UPDATE), so the
#: cached World is rebuilt after any of them. One row read per batch, whatever the fleet's size.
_VERSION_SQL = "SELECT coalesce((SELECT token FROM scalers_configgeneration WHERE id = 1), '')"


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
        "mandatory_labels, roles, config, retiring, warm_pool_enabled, warm_pool_size, warm_pool_idle_timeout_seconds, "
        "host_tools_missing, host "
        "FROM scalers_scaler ORDER BY id",
    )
    # Config order (routing ties and empty runsOn pick the first): the order of the
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
    "SELECT 0, scaler_id, machine_pool_id, count(*), coalesce(sum(cpus), 0)::float8, "
    "coalesce(sum(memory_bytes), 0)::int8, "
    "NULL::text FROM scalers_reservation GROUP BY scaler_id, machine_pool_id "
    "UNION ALL "
    "SELECT 1, scaler_id, NULL, count(*), "
    "count(*) FILTER (WHERE state = %(spawning)s AND rq_job_id <> '')::float8, "
    "count(*) FILTER (WHERE state = %(spawning)s AND rq_job_id = '')::int8, NULL::text "
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
            s.spawns_in_flight, s.spawns_waiting = int(a), int(b)
    return usage


_SNAPSHOT_SQL = _USAGE_SQL + " UNION ALL SELECT 2, NULL, NULL, 0, 0::float8, 0::int8, (" + _VERSION_SQL + ")"


def _snapshot_params() -> dict:
    return {"active": list(_ACTIVE), "spawning": str(AgentState.SPAWNING)}


def _fingerprint(rows) -> str:
    """The config rows' fingerprint, carried by the snapshot's kind-2 row."""
    return next(r[6] for r in rows if r[0] == 2)


def lock_and_snapshot(conn, *, begin: bool = False) -> tuple[dict, World, Usage]:
    """Lock, then read the snapshot, in ONE round trip (psycopg pipeline mode).

    Both statements are sent together; the server runs the snapshot statement only after the
    locking one returned, and under READ COMMITTED it takes its own snapshot then, so it sees
    everything committed before the lock was granted. ``conn``: the raw psycopg connection,
    inside the caller's transaction, or in autocommit mode with ``begin=True``: then the
    transaction's ``BEGIN`` goes in the same round trip.
    """
    params = _snapshot_params()
    with psycopg.Cursor(conn) as lock_cur, psycopg.Cursor(conn) as snap_cur:
        with conn.pipeline():
            if begin:
                conn.execute("BEGIN")
            lock_cur.execute(_LOCK_SQL, prepare=True)
            snap_cur.execute(_SNAPSHOT_SQL, params, prepare=True)
        row = lock_cur.fetchone()
        rows = snap_cur.fetchall()
        if row is None:  # never imported: create the row, then lock it the plain way
            config_row = lock_admission(lock_cur)
            snap_cur.execute(_SNAPSHOT_SQL, params, prepare=True)
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


# --------------------------------------------------------------------------- writing a decided batch

#: Per-row fields of a new agent and their SQL types, in the order of the ``agents`` tuples
#: :func:`write_batch` takes.
AGENT_ROW = (
    ("agent_id", "text"),
    ("scaler_id", "int8"),
    ("label_set_id", "int8"),
    ("labels", "jsonb"),
    ("warm", "bool"),
    ("bound_job_id", "text"),
    ("run_id", "text"),
    ("job_image", "text"),
    ("job_credentials_ref", "text"),
    ("rq_job_id", "text"),
)
#: Per-row fields of a new reservation (joined to its agent by ``agent_ref``), in tuple order.
RESERVATION_ROW = (
    ("agent_ref", "text"),
    ("scaler_id", "int8"),
    ("machine_pool_id", "int8"),
    ("cpus", "float8"),
    ("memory_bytes", "int8"),
    ("limit_cpus", "float8"),
    ("limit_memory_bytes", "int8"),
)
#: Per-row fields of a request record: (JSON key, SQL type, key of the record dict).
RECORD_ROW = (
    ("j", "text", "job_id"),
    ("rn", "text", "run_id"),
    ("l", "jsonb", "labels"),
    ("res", "jsonb", "resources"),
    ("c", "float8", "cpus"),
    ("m", "int8", "memory_bytes"),
    ("o", "text", "outcome"),
    ("cap", "text", "cap"),
    ("reason", "text", "reason"),
    ("sn", "text", "scaler_name"),
    ("ar", "text", "agent_ref"),
)

#: Per-row fields of a counter increment.
COUNTER_ROW = (("cn", "text"), ("ck", "text"), ("cl", "jsonb"), ("cv", "float8"))

_WRITE_SQL: str | None = None


def _insert_columns(model, per_row: dict[str, str], fixed: dict[str, str]) -> tuple[list, list]:
    """Columns and SELECT expressions for an INSERT of ``model`` rows: ``per_row`` maps column ->
    expression over the row source's alias, ``fixed`` column -> named parameter; every other
    concrete column gets its field default (so columns other helpers add keep working), as a
    literal, so the statement has a handful of parameters."""
    cols, exprs = [], []
    for f in model._meta.concrete_fields:
        if f.primary_key:
            continue
        col = f.column
        cols.append(col)
        if col in per_row:
            exprs.append(per_row[col])
        elif col in fixed:
            exprs.append(f"%({fixed[col]})s::{f.cast_db_type(connection)}")
        else:
            literal = psycopg.sql.Literal(f.get_db_prep_save(f.get_default(), connection)).as_string(None)
            exprs.append(f"{literal.replace('%', '%%')}::{f.cast_db_type(connection)}")
    return cols, exprs


def _rows_of(param: str, alias: str, fields) -> str:
    """``json_to_recordset(<param>) AS <alias>(<field> <type>, ...)``: a batch's rows sent as one
    JSON array of objects (one parameter, parsed by the server, instead of an array per column)."""
    return f"json_to_recordset(%({param})s::json) AS {alias}({', '.join(f'{f[0]} {f[1]}' for f in fields)})"


def _write_statement() -> str:
    """The one statement that writes a decided batch (built once per process from the models)."""
    global _WRITE_SQL
    if _WRITE_SQL is not None:
        return _WRITE_SQL
    a_cols, a_exprs = _insert_columns(
        Agent,
        {name: f"u.{name}" for name, _ in AGENT_ROW},
        {"state": "state", "owner_instance": "owner", "created_at": "now", "updated_at": "now"},
    )
    r_cols, r_exprs = _insert_columns(
        Reservation,
        {"agent_id": "a.id"} | {name: f"v.{name}" for name, _ in RESERVATION_ROW if name != "agent_ref"},
        {"owner_instance": "owner", "created_at": "now"},
    )
    sql = (
        f"WITH a AS (INSERT INTO agents_agent ({', '.join(a_cols)}) SELECT {', '.join(a_exprs)} "
        f"FROM {_rows_of('agents', 'u', AGENT_ROW)} "
        "RETURNING id, agent_id), "
        f"r AS (INSERT INTO scalers_reservation ({', '.join(r_cols)}) SELECT {', '.join(r_exprs)} "
        f"FROM a JOIN {_rows_of('reservations', 'v', RESERVATION_ROW)} ON v.agent_ref = a.agent_id RETURNING 1), "
        "s AS (INSERT INTO scalers_scalerequest (job_id, run_id, labels, resources, cpus, memory_bytes, outcome, cap, "
        "reason, scaler_name, agent_ref, attempts, owner_instance, first_requested_at, decided_at) "
        "SELECT j, rn, l, res, c, m, o, cap, reason, sn, ar, n, %(owner)s, %(now)s, %(now)s "
        f"FROM {_rows_of('records', 'w', RECORD_ROW + (('n', 'int4'),))} "
        "ON CONFLICT (job_id) DO UPDATE SET run_id = EXCLUDED.run_id, labels = EXCLUDED.labels, "
        "resources = EXCLUDED.resources, cpus = EXCLUDED.cpus, memory_bytes = EXCLUDED.memory_bytes, "
        "outcome = EXCLUDED.outcome, cap = EXCLUDED.cap, reason = EXCLUDED.reason, scaler_name = EXCLUDED.scaler_name, "
        "agent_ref = EXCLUDED.agent_ref, attempts = scalers_scalerequest.attempts + EXCLUDED.attempts, "
        "owner_instance = EXCLUDED.owner_instance, decided_at = EXCLUDED.decided_at RETURNING 1), "
        "c AS (INSERT INTO scalers_metriccounter (name, label_key, labels, value) "
        f"SELECT cn, ck, cl, cv FROM {_rows_of('counters', 'x', COUNTER_ROW)} "
        "ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value "
        "RETURNING 1), "
        # Jobs whose stored decision was at-capacity and that are admitted now (the CTE reads the
        # rows as they were before this statement): the orchestrator's retry re-drove them. The
        # batch's jobs drive it, one unique-index look-up each: a join lets the planner scan every
        # stored at-capacity record once per job instead.
        f"p AS (SELECT count(*) AS n FROM {_rows_of('records', 'q', (('j', 'text'), ('o', 'text')))} "
        "WHERE q.o = ANY(%(admitted)s::text[]) AND (SELECT sr.outcome FROM scalers_scalerequest sr "
        "WHERE sr.job_id = q.j) = %(waiting)s::text), "
        "d AS (INSERT INTO scalers_metriccounter (name, label_key, labels, value) "
        "SELECT %(rd_name)s::text, %(rd_key)s::text, %(rd_labels)s::jsonb, n FROM p "
        "WHERE n > 0 AND %(rd_name)s::text <> '' "
        "ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value RETURNING 1) "
        "SELECT a.id, a.agent_id FROM a"
    )
    _WRITE_SQL = sql
    return sql


def write_batch(
    cursor,
    *,
    now,
    instance_id: str,
    agents: list[tuple],
    reservations: list[tuple],
    records: list[dict],
    counters: dict[tuple[str, str], tuple[dict, float]],
    redispatch: tuple[str, dict] | None = None,
    commit: bool = False,
) -> dict[str, int]:
    """Write a decided batch in ONE statement: new agents (state spawning; ``rq_job_id`` set for
    those that took a spawn slot in this transaction), their reservations,
    the request records (one per job id, ``attempts`` the number of times the batch holds it)
    and the counter increments. ``redispatch``: ``(counter name, labels)`` that is added the number
    of jobs whose stored decision was ``at-capacity`` and that this batch admits (spawning or
    assigned). ``commit``: send the transaction's ``COMMIT`` in the same round trip (the caller
    began it, see :func:`lock_and_snapshot`).

    ``agents``: tuples in :data:`AGENT_ROW` order (``labels`` a list of strings);
    ``reservations``: tuples in :data:`RESERVATION_ROW` order; ``records``: dicts with the keys of
    :data:`RECORD_ROW`. Each kind of row goes to the server as one JSON document. Returns
    ``{agent_id: pk}`` for the agents written. Raises ``psycopg.errors.UniqueViolation`` when an
    agent id already exists (:func:`agent_id_taken` tells that case apart); the transaction is
    then failed and nothing of it is kept.
    """
    latest: dict[str, dict] = {}
    attempts: dict[str, int] = {}
    for r in records:
        latest[r["job_id"]] = r
        attempts[r["job_id"]] = attempts.get(r["job_id"], 0) + 1
    agent_keys = [name for name, _ in AGENT_ROW]
    reservation_keys = [name for name, _ in RESERVATION_ROW]
    rd_name, rd_labels = redispatch or ("", {})
    params = {
        "state": str(AgentState.SPAWNING),
        "owner": instance_id,
        "now": now,
        "agents": json.dumps([dict(zip(agent_keys, row, strict=True)) for row in agents]),
        "reservations": json.dumps([dict(zip(reservation_keys, row, strict=True)) for row in reservations]),
        "records": json.dumps(
            [{key: r[name] for key, _, name in RECORD_ROW} | {"n": attempts[r["job_id"]]} for r in latest.values()]
        ),
        "counters": json.dumps(
            [{"cn": name, "ck": key, "cl": lab, "cv": float(amount)} for (name, key), (lab, amount) in counters.items()]
        ),
        "waiting": str(ScaleOutcome.AT_CAPACITY),
        "admitted": [str(ScaleOutcome.SPAWNING), str(ScaleOutcome.ASSIGNED)],
        "rd_name": rd_name,
        "rd_key": label_key(rd_labels),
        "rd_labels": json.dumps(rd_labels),
    }
    if commit:
        with cursor.connection.pipeline():
            cursor.execute(_write_statement(), params, prepare=True)
            cursor.connection.execute("COMMIT")
    else:
        cursor.execute(_write_statement(), params, prepare=True)
    return {agent_id: pk for pk, agent_id in cursor.fetchall()}


#: The unique constraint of ``agents_agent.agent_id`` (PostgreSQL's name for a column's UNIQUE, as
#: the migration created it). Matched by name: the error's detail text is translated under a
#: server's ``lc_messages``.
AGENT_ID_CONSTRAINT = f"{Agent._meta.db_table}_agent_id_key"


def agent_id_taken(exc: BaseException) -> bool:
    """True when ``exc`` is the unique violation of an agent id that already exists (a minted
    id can collide with one in the table; the batch is then decided again with new ids)."""
    diag = getattr(exc, "diag", None)
    return (
        isinstance(exc, psycopg.errors.UniqueViolation)
        and diag is not None
        and diag.constraint_name == AGENT_ID_CONSTRAINT
    )


def release(agent_id: str, reason: str) -> bool:
    """Delete the reservation of ``agent_id``; True if one was held, False if already released.

    Idempotent and safe to race (one ``DELETE ... RETURNING`` decides who released). Records a
    ``reservation.released`` event (detail = ``reason``, payload = the freed cpus/bytes). Does not
    change the agent's state.
    """
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(
                "DELETE FROM scalers_reservation r USING agents_agent a WHERE r.agent_id = a.id AND a.agent_id = %s "
                "RETURNING r.cpus, r.memory_bytes, a.id",
                [agent_id],
            )
            row = cur.fetchone()
        if row is None:
            return False
        agent = Agent.objects.select_related("scaler").get(pk=row[2])
        record_event(
            agent,
            EventType.RELEASED,
            detail=reason,
            payload={"reason": reason, "cpus": row[0], "memoryBytes": row[1]},
        )
    return True
