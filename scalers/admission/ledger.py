"""Database side of admission: the lock, the usage snapshot, idle warm agents, metric counters
and writing a decided batch. Every function runs inside the caller's transaction on the caller's
connection; SQL is written out because these few statements run once per batch on the hot path.
Why the lock is the ``ConfigState`` row: docs/admission.md ("The lock").
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
import psycopg
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from agents.choices import ACTIVE_STATES, LIVE_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import LIVE_JOB_CONSTRAINT, LIVE_KEY_CONSTRAINT, Agent
from audit.models import AuditRecord
from lib.prepared import prepare_once
from scalers.metrics import label_key
from scalers.models import Reservation, ScaleOutcome, this_host
from scalers.pauses import pause_row_json

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

#: The server-side prepared statements a batch runs, by name (``PREPARE``d once per connection by
#: :func:`prepare_statements`; their text is built in :func:`_statements`).
LOCK_STATEMENT = "kici_admission_lock"
SNAPSHOT_STATEMENT = "kici_admission_snapshot"
WRITE_STATEMENT = "kici_admission_write"
FOLD_STATEMENT = "kici_admission_fold"
GUARD_STATEMENT = "kici_admission_guard"
LOCK_ONLY_STATEMENT = "kici_admission_lock_only"
NO_LIVE_STATEMENT = "kici_admission_no_live"


def prepare_statements(conn) -> None:
    """``PREPARE`` the lock, the guards, the snapshot, the batch write and the tally fold on ``conn`` (a raw
    psycopg connection), once per connection (``lib.prepared.prepare_once``): a batch then sends each
    round trip as one simple-protocol query of ``EXECUTE``s, which the server neither parses nor
    plans again and psycopg sends without its per-statement machinery."""
    prepare_once(conn, _statements())


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _results(cur) -> list[Any]:
    """Every result of the simple-protocol query ``cur`` just ran, in order: its rows, or None for
    a statement that returns none (``BEGIN``, ``COMMIT``)."""
    out = []
    while True:
        # The result's status, not ``cur.description``, which builds a Column per field.
        out.append(cur.fetchall() if cur.pgresult.status == _TUPLES_OK else None)
        if not cur.nextset():
            return out


# --------------------------------------------------------------------------- the lock and the config row

# The global config row and its version (everything admission-relevant in it, fingerprinted).
_CONFIG_SQL = (
    "SELECT global_max_agents, global_max_cpu, global_max_memory_bytes, defaults, "
    "coalesce(imported_at::text, '') || '|' || global_max_agents || '|' || coalesce(global_max_cpu::text, '') "
    "|| '|' || coalesce(global_max_memory_bytes::text, '') || '|' || md5(defaults::text) || md5(raw::text) "
    "FROM scalers_configstate WHERE id = 1"
)
_LOCK_SQL = _CONFIG_SQL + " FOR UPDATE"
# The lock alone, for a batch decided from a held snapshot (whose digest holds the row's version).
_LOCK_ONLY_SQL = "SELECT FROM scalers_configstate WHERE id = 1 FOR UPDATE"


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


def bind_warm_agent(
    cursor, agent_pk: int, job_id: str, run_id: str, key: str = "", body: dict | None = None, token: str = ""
) -> bool:
    """Compare-and-swap an idle warm agent onto a job, keeping the request's idempotency ``key``
    and ``body`` (``scalers.admission.idempotency``) and the asking API ``token``'s name; False if
    it stopped being idle. Raises
    ``psycopg.errors.UniqueViolation`` when the job or key has a live agent already
    (:func:`live_agent_taken`)."""
    cursor.execute(
        "UPDATE agents_agent SET bound_job_id = %s, run_id = %s, idempotency_key = %s, scale_body = %s, "
        "asked_by_token = %s, updated_at = now() "
        "WHERE id = %s AND state = %s AND bound_job_id = '' AND active_jobs = 0",
        [job_id, run_id, key, Jsonb(body) if body is not None else None, token, agent_pk, str(AgentState.RUNNING)],
    )
    return cursor.rowcount == 1


def _live_where(jobs: str, keys: str) -> str:
    """The live agents (``agents.choices.LIVE_STATES``) bound to the jobs of the array parameter
    ``jobs`` or asked for with the idempotency keys of ``keys``; its predicates are those of the
    two partial unique indexes, so each job and key is one look-up in them."""
    live = ", ".join(f"'{s}'" for s in LIVE_STATES)
    return (
        f"a.state IN ({live}) AND ((a.bound_job_id = ANY({jobs}::text[]) AND a.bound_job_id <> '') "
        f"OR (a.idempotency_key = ANY({keys}::text[]) AND a.idempotency_key <> ''))"
    )


_LIVE_SQL = (
    "SELECT a.id, a.agent_id, s.name, s.type, a.warm, a.bound_job_id, a.idempotency_key, a.scale_body "
    "FROM agents_agent a JOIN scalers_scaler s ON s.id = a.scaler_id WHERE " + _live_where("%s", "%s")
)
#: The guard of a batch from a held snapshot that refuses jobs (``$1``) or keys (``$2``): fails as a
#: moved snapshot when one of them has a live agent, which is then the answer (a repeat). Prepared
#: (:data:`NO_LIVE_STATEMENT`): planning it, the partial indexes' predicates proved each time, cost
#: more than running it.
_NO_LIVE_SQL = f"SELECT kici_admission_guard(NOT EXISTS (SELECT 1 FROM agents_agent a WHERE {_live_where('$1', '$2')}))"
_LIVE_COLUMNS = ("id", "agent_id", "scaler", "type", "warm", "bound_job_id", "idempotency_key", "scale_body")


def _live_rows(rows) -> list[dict]:
    """:data:`_LIVE_SQL`'s rows as dicts (``scale_body`` parsed when it comes as text)."""
    out = [dict(zip(_LIVE_COLUMNS, row, strict=True)) for row in rows or ()]
    for row in out:
        if isinstance(row["scale_body"], str):
            row["scale_body"] = orjson.loads(row["scale_body"])
    return out


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
    _attach_pauses(cursor, scalers)
    label_sets = dict_rows(cursor, "SELECT id, scaler_id, index, labels, config, retired FROM scalers_labelset")
    pools = dict_rows(cursor, "SELECT id, max_cpu, max_memory_bytes FROM scalers_machinepool")
    world = build_world(version, config_row, scalers, label_sets, pools)
    WORLD_CACHE.put(world)
    return world


def _attach_pauses(cursor, scalers: list[dict]) -> None:
    """Give each scaler row its ``pause`` (``scalers.pauses.pause_row_json``): its own, else its
    host's (a scaler without a host is this host's), else None."""
    rows = dict_rows(
        cursor,
        "SELECT coalesce(s.name, '') AS scaler_name, p.scaler_id, p.host, p.requested_by, p.approved_by, p.reason, "
        "p.paused_at, p.operation_ref FROM scalers_pause p LEFT JOIN scalers_scaler s ON s.id = p.scaler_id",
    )
    own = {r["scaler_id"]: pause_row_json(r) for r in rows if r["scaler_id"] is not None}
    hosts = {r["host"]: pause_row_json(r) for r in rows if r["host"]}
    for row in scalers:
        row["pause"] = own.get(row["id"]) or hosts.get(row["host"] or this_host())


def _literal(value) -> str:
    """``value`` as an SQL literal (for constants written into statement text)."""
    return psycopg.sql.Literal(value).as_string(None)


# The usage is the sum of the tally's rows (``scalers.models.UsageTally``: the database adds them
# as reservations and agents change), a few per scaler whatever the size of the fleet.
_USAGE_SQL = (
    "SELECT 0, scaler_id, machine_pool_id, sum(reservations)::int8, sum(cpus)::float8, sum(memory_bytes)::int8, "
    "sum(active)::int8, sum(spawns_in_flight)::int8, sum(spawns_waiting)::int8, count(*), NULL::text "
    "FROM scalers_usagetally GROUP BY scaler_id, machine_pool_id"
)

# What a decision reads from the database, as one text: the config row's version (its ``xmin``:
# every write of the row makes a new one), the routing rows' fingerprint and the tally's row
# count and highest id (NULL before the config row exists). The tally only gains rows, but for a
# fold or a recount, both under the admission lock and both writing rows with higher ids; so under
# the lock the digest is the one a console's last batch read after its own writes exactly when
# nobody else changed what admission counts since.
_DIGEST = (
    f"(SELECT xmin::text FROM scalers_configstate WHERE id = 1) || '#' || ({_VERSION_SQL}) || '#' || "
    "(SELECT count(*) || '@' || coalesce(max(id), 0) FROM scalers_usagetally)"
)

#: Tally rows past which a batch folds them into one per scaler and machine pool (in its write's
#: round trip, under the admission lock, so no two folds meet).
FOLD_ROWS = 64

_FOLD_SQL = (
    "WITH gone AS (DELETE FROM scalers_usagetally RETURNING scaler_id, machine_pool_id, reservations, cpus, "
    "memory_bytes, active, spawns_in_flight, spawns_waiting) "
    "INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active, "
    "spawns_in_flight, spawns_waiting) "
    "SELECT scaler_id, machine_pool_id, sum(reservations), sum(cpus), sum(memory_bytes), sum(active), "
    "sum(spawns_in_flight), sum(spawns_waiting) FROM gone GROUP BY scaler_id, machine_pool_id "
    "HAVING sum(reservations) <> 0 OR sum(cpus) <> 0 OR sum(memory_bytes) <> 0 OR sum(active) <> 0 "
    "OR sum(spawns_in_flight) <> 0 OR sum(spawns_waiting) <> 0"
)


def _usage_from_rows(rows) -> Usage:
    usage = Usage()
    for kind, scaler_id, pool_id, n, cpus, mem, active, in_flight, waiting, summed, _ in rows:
        if kind != 0:
            continue
        s = usage.scaler(scaler_id)
        for t in (usage.total, s) + ((usage.pool(pool_id),) if pool_id is not None else ()):
            t.reservations += n
            t.cpus += cpus
            t.memory_bytes += mem
        for t in (usage.total, s):
            t.active += active
        s.spawns_in_flight += in_flight
        s.spawns_waiting += waiting
        usage.tally_rows += summed
    return usage


# The usage rows (kind 0), the routing rows' fingerprint (kind 2) and the digest (kind 3).
_SNAPSHOT_SQL = (
    _USAGE_SQL
    + " UNION ALL SELECT 2, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, ("
    + _VERSION_SQL
    + ") UNION ALL SELECT 3, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, "
    + _DIGEST
)

# The guard: fails the transaction (SQLSTATE :data:`SNAPSHOT_MOVED`) unless the digest under the
# lock is ``$1``.
_GUARD_SQL = f"SELECT kici_admission_guard({_DIGEST} = $1)"

#: The SQLSTATE of the guard's failure (``kici_admission_guard``, migration ``scalers.0014``).
SNAPSHOT_MOVED = "KA001"


def _fingerprint(rows) -> str:
    """The config rows' fingerprint, carried by the snapshot's kind-2 row."""
    return next(r[-1] for r in rows if r[0] == 2)


def lock_and_snapshot(
    conn, *, begin: bool = False, jobs: Sequence[str] = (), keys: Sequence[str] = ()
) -> tuple[dict, World, Usage, list[dict]]:
    """Lock, then read the snapshot and the live agents of ``jobs`` and idempotency ``keys`` in ONE
    round trip; the snapshot statement runs after the lock is granted, so it sees every commit before
    it (docs/admission.md, "The lock"). ``conn``: the raw psycopg connection, in the caller's
    transaction or in autocommit with ``begin=True`` (``BEGIN`` in the same round trip). Returns the
    config row, the World, the Usage and the live agents as dicts ``{id, agent_id, scaler, type,
    warm, bound_job_id, idempotency_key, scale_body}``.
    """
    prepare_statements(conn)
    with psycopg.ClientCursor(conn) as cur:
        cur.execute(
            ("BEGIN; " if begin else "") + f"EXECUTE {LOCK_STATEMENT}; EXECUTE {SNAPSHOT_STATEMENT}; {_LIVE_SQL}",
            [list(jobs), list(keys)],
        )
        *_, locked, rows, live = _results(cur)
        if not locked:  # never imported: create the row, then lock it the plain way
            config_row = lock_admission(cur)
            cur.execute(f"EXECUTE {SNAPSHOT_STATEMENT}")
            rows = cur.fetchall()
            cur.execute(_LIVE_SQL, [list(jobs), list(keys)])
            live = cur.fetchall()
        else:
            config_row = _config_dict(locked[0])
        return config_row, load_world(cur, config_row, _fingerprint(rows)), _usage_from_rows(rows), _live_rows(live)


def load_snapshot(cursor, config_row: dict) -> tuple[World, Usage]:
    """The World and the Usage in one round trip (one statement, one snapshot) after the lock."""
    cursor.execute(_SNAPSHOT_SQL)
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
    ("idempotency_key", "text"),
    ("scale_body", "jsonb"),
    ("asked_by_token", "text"),
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
    ("tk", "text", "token_name"),
)

#: Per-row fields of a counter increment.
COUNTER_ROW = (("cn", "text"), ("ck", "text"), ("cl", "jsonb"), ("cv", "float8"))

#: Per-row fields of an audit record (the keys of ``audit.records.audit_fields``; its time is the
#: batch's ``now``).
AUDIT_ROW = (
    ("action", "text"),
    ("actor", "text"),
    ("actor_kind", "text"),
    ("scaler_name", "text"),
    ("operation_id", "int8"),
    ("operation_kind", "text"),
    ("agent_ref", "text"),
    ("detail", "text"),
    ("remote_addr", "inet"),
)

#: The write statement's parameters, in the order ``PREPARE`` numbers them (``$1`` first).
WRITE_PARAMS = (
    "state",
    "owner",
    "now",
    "agents",
    "reservations",
    "records",
    "counters",
    "waiting",
    "admitted",
    "rd_name",
    "rd_key",
    "rd_labels",
    "audits",
)


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
            literal = _literal(f.get_db_prep_save(f.get_default(), connection))
            exprs.append(f"{literal.replace('%', '%%')}::{f.cast_db_type(connection)}")
    return cols, exprs


def _rows_of(param: str, alias: str, fields) -> str:
    """``json_to_recordset(<param>) AS <alias>(<field> <type>, ...)``: a batch's rows sent as one
    JSON array of objects (one parameter, parsed by the server, instead of an array per column)."""
    return f"json_to_recordset(%({param})s::json) AS {alias}({', '.join(f'{f[0]} {f[1]}' for f in fields)})"


@cache
def _write_statement() -> str:
    """The one statement that writes a decided batch (built once per process from the models),
    with the positional parameters of :data:`WRITE_PARAMS`. It is written with named ones, which
    read better; ``PREPARE`` takes ``$n``."""
    a_cols, a_exprs = _insert_columns(
        Agent,
        {name: f"u.{name}" for name, _ in AGENT_ROW},
        {"state": "state", "owner_instance": "owner", "created_at": "now", "updated_at": "now"},
    )
    au_cols, au_exprs = _insert_columns(AuditRecord, {name: f"au.{name}" for name, _ in AUDIT_ROW}, {"at": "now"})
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
        # The request records, parsed once for their upsert and the redispatch count.
        f"w AS (SELECT * FROM {_rows_of('records', 'w', RECORD_ROW + (('n', 'int4'),))}), "
        "s AS (INSERT INTO scalers_scalerequest (job_id, run_id, labels, resources, cpus, memory_bytes, outcome, cap, "
        "reason, scaler_name, agent_ref, token_name, attempts, owner_instance, first_requested_at, decided_at) "
        "SELECT j, rn, l, res, c, m, o, cap, reason, sn, ar, tk, n, %(owner)s, %(now)s, %(now)s FROM w "
        "ON CONFLICT (job_id) DO UPDATE SET run_id = EXCLUDED.run_id, labels = EXCLUDED.labels, "
        "resources = EXCLUDED.resources, cpus = EXCLUDED.cpus, memory_bytes = EXCLUDED.memory_bytes, "
        "outcome = EXCLUDED.outcome, cap = EXCLUDED.cap, reason = EXCLUDED.reason, scaler_name = EXCLUDED.scaler_name, "
        "agent_ref = EXCLUDED.agent_ref, token_name = EXCLUDED.token_name, "
        "attempts = scalers_scalerequest.attempts + EXCLUDED.attempts, "
        "owner_instance = EXCLUDED.owner_instance, decided_at = EXCLUDED.decided_at RETURNING 1), "
        "c AS (INSERT INTO scalers_metriccounter (name, label_key, labels, value) "
        f"SELECT cn, ck, cl, cv FROM {_rows_of('counters', 'x', COUNTER_ROW)} "
        "ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value "
        "RETURNING 1), "
        # Jobs whose stored decision was at-capacity and that are admitted now (the CTE reads the
        # rows as they were before this statement): the orchestrator's retry re-drove them. The
        # batch's jobs drive it, one unique-index look-up each: a join lets the planner scan every
        # stored at-capacity record once per job instead.
        "p AS (SELECT count(*) AS n FROM w AS q "
        "WHERE q.o = ANY(%(admitted)s::text[]) AND (SELECT sr.outcome FROM scalers_scalerequest sr "
        "WHERE sr.job_id = q.j) = %(waiting)s::text), "
        "d AS (INSERT INTO scalers_metriccounter (name, label_key, labels, value) "
        "SELECT %(rd_name)s::text, %(rd_key)s::text, %(rd_labels)s::jsonb, n FROM p "
        "WHERE n > 0 AND %(rd_name)s::text <> '' "
        "ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value "
        "RETURNING 1), "
        # The audit records of the admissions API tokens asked for.
        f"au AS (INSERT INTO {AuditRecord._meta.db_table} ({', '.join(au_cols)}) SELECT {', '.join(au_exprs)} "
        f"FROM {_rows_of('audits', 'au', AUDIT_ROW)} RETURNING 1) "
        "SELECT a.id, a.agent_id FROM a"
    )
    position = {name: i for i, name in enumerate(WRITE_PARAMS, 1)}
    sql = re.sub(r"%\((\w+)\)s", lambda m: f"${position[m[1]]}", sql)
    return sql.replace("%%", "%")


@cache
def _statements() -> dict[str, str]:
    """The text of each statement :func:`prepare_statements` prepares, by name."""
    return {
        LOCK_STATEMENT: _LOCK_SQL,
        SNAPSHOT_STATEMENT: _SNAPSHOT_SQL,
        WRITE_STATEMENT: _write_statement(),
        FOLD_STATEMENT: _FOLD_SQL,
        GUARD_STATEMENT: _GUARD_SQL,
        LOCK_ONLY_STATEMENT: _LOCK_ONLY_SQL,
        NO_LIVE_STATEMENT: _NO_LIVE_SQL,
    }


@dataclass
class Snapshot:
    """A snapshot a batch decides against: the World, the Usage (a batch books its admissions
    into it) and their :data:`_DIGEST`."""

    world: World
    usage: Usage
    digest: str


@dataclass
class _Held:
    """A connection's held snapshot and how its last ones fared."""

    snapshot: Snapshot | None = None
    #: Held snapshots found moved in a row (reset by one that held).
    moves: int = 0
    #: Batches still to decide from a fresh snapshot (see :data:`HOLD_OFF_BATCHES`).
    hold_off: int = 0


#: Batches a connection decides from a fresh snapshot after its held snapshots moved twice in a
#: row (another console admits on the same database, so most would move again; a single move is
#: a config change or a worker's write).
HOLD_OFF_BATCHES = 16

_HELD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def take_held_snapshot(conn) -> Snapshot | None:
    """The snapshot ``conn``'s last batch left after its own writes, once (the next batch books
    into it); None when there is none: no batch yet, a failed one, the routing rows changed under
    it, or held snapshots are off for a while (:data:`HOLD_OFF_BATCHES`)."""
    held = _HELD.get(conn)
    if held is None:
        return None
    snapshot, held.snapshot = held.snapshot, None
    return snapshot


class SnapshotMoved(Exception):
    """The state under the lock was not the held snapshot a batch was decided against: nothing was
    written and the transaction is rolled back; decide the batch again from a fresh snapshot."""


def write_batch(
    conn,
    *,
    fold: bool = False,
    commit: bool = False,
    guard: str | None = None,
    hold: World | None = None,
    refused: tuple[list[str], list[str]] | None = None,
    **batch,
) -> dict[str, int]:
    """Write a decided batch (``batch``: :func:`write_query`'s arguments) in ONE statement on ``conn``,
    the raw psycopg connection of the caller's transaction (docs/admission.md, "One batch"). ``fold``:
    fold the tally's rows too (:data:`FOLD_ROWS`; the caller holds the lock). ``commit``: ``COMMIT``
    in the same round trip. ``guard`` (autocommit, with ``commit``): the held snapshot's digest,
    checked under the lock first, with the ``refused`` jobs and keys; ``hold``: the batch's World, to
    hold the snapshot after it. Returns ``{agent_id: pk}``. Raises :class:`SnapshotMoved` or
    ``psycopg.errors.UniqueViolation`` (:func:`agent_id_taken`); nothing is kept then.
    """
    prepare_statements(conn)
    sql, args = write_query(**batch)
    held = _HELD.get(conn) or _HELD.setdefault(conn, _Held())
    if held.hold_off:
        held.hold_off -= 1
        hold = None
    head, tail = [], [sql]
    if guard is not None:
        head = ["BEGIN", f"EXECUTE {LOCK_ONLY_STATEMENT}", f"EXECUTE {GUARD_STATEMENT}(%s)"]
        if refused and (refused[0] or refused[1]):
            head.append(f"EXECUTE {NO_LIVE_STATEMENT}(%s, %s)")
            args = [guard, list(refused[0]), list(refused[1]), *args]
        else:
            args = [guard, *args]
    if fold:
        tail.append(f"EXECUTE {FOLD_STATEMENT}")
    if hold is not None:
        tail.append(f"EXECUTE {SNAPSHOT_STATEMENT}")
    if commit:
        tail.append("COMMIT")
    with psycopg.ClientCursor(conn) as cur:
        try:
            cur.execute("; ".join(head + tail), args)
        except psycopg.Error as exc:
            if guard is None or exc.sqlstate != SNAPSHOT_MOVED:
                raise
            conn.rollback()
            held.moves += 1
            if held.moves == 2:
                held.hold_off, held.moves = HOLD_OFF_BATCHES, 0
            raise SnapshotMoved() from exc
        results = _results(cur)
    if guard is not None:
        held.moves = 0
    rows = results[len(head)]
    if hold is not None:
        after = results[len(head) + 1 + fold]
        digest = next(r[-1] for r in after if r[0] == 3)
        # The World's version ends with the fingerprint it was built from (see load_world).
        if digest is not None and hold.version.endswith("#" + _fingerprint(after)):
            held.snapshot = Snapshot(hold, _usage_from_rows(after), digest)
    return {agent_id: pk for pk, agent_id in rows}


def _json(value) -> str:
    """``value`` as JSON text (a batch's documents: orjson is several times faster than ``json``)."""
    return orjson.dumps(value).decode()


def write_query(
    *,
    now,
    instance_id: str,
    agents: list[tuple],
    reservations: list[tuple],
    records: list[dict],
    counters: dict[tuple[str, str], tuple[dict, float]],
    redispatch: tuple[str, dict] | None = None,
    audits: Sequence[dict] = (),
) -> tuple[str, list]:
    """The ``EXECUTE`` of the prepared write of a decided batch and its arguments (for a client-side
    binding cursor), each kind of row one JSON document: ``agents`` (tuples in :data:`AGENT_ROW`
    order, spawning, ``rq_job_id`` set when they took a spawn slot), ``reservations``
    (:data:`RESERVATION_ROW`), ``records`` (one per job id, keys of :data:`RECORD_ROW`, ``attempts``
    how often the batch holds it), ``counters`` increments, ``audits`` (``audit.records.audit_fields``
    dicts, stamped ``now``); ``redispatch``: ``(counter name, labels)``, added the jobs stored
    ``at-capacity`` that this batch admits.
    """
    latest: dict[str, dict] = {}
    attempts: dict[str, int] = {}
    for r in records:
        latest[r["job_id"]] = r
        attempts[r["job_id"]] = attempts.get(r["job_id"], 0) + 1
    agent_keys = [name for name, _ in AGENT_ROW]
    reservation_keys = [name for name, _ in RESERVATION_ROW]
    admitted = (str(ScaleOutcome.SPAWNING), str(ScaleOutcome.ASSIGNED))
    if not any(r["outcome"] in admitted for r in latest.values()):
        redispatch = None  # nothing to count: the server skips the look-ups
    rd_name, rd_labels = redispatch or ("", {})
    params = {
        "state": str(AgentState.SPAWNING),
        "owner": instance_id,
        "now": now,
        "agents": _json([dict(zip(agent_keys, row, strict=True)) for row in agents]),
        "reservations": _json([dict(zip(reservation_keys, row, strict=True)) for row in reservations]),
        "records": _json(
            [{key: r[name] for key, _, name in RECORD_ROW} | {"n": attempts[r["job_id"]]} for r in latest.values()]
        ),
        "counters": _json(
            [{"cn": name, "ck": key, "cl": lab, "cv": float(amount)} for (name, key), (lab, amount) in counters.items()]
        ),
        "waiting": str(ScaleOutcome.AT_CAPACITY),
        "admitted": list(admitted),
        "rd_name": rd_name,
        "rd_key": label_key(rd_labels),
        "rd_labels": _json(rd_labels),
        "audits": _json([{name: a[name] for name, _ in AUDIT_ROW} for a in audits]),
    }
    placeholders = ", ".join(["%s"] * len(WRITE_PARAMS))
    return f"EXECUTE {WRITE_STATEMENT}({placeholders})", [params[name] for name in WRITE_PARAMS]


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


#: The unique indexes of live agents' jobs and idempotency keys (``agents.models.Agent``).
LIVE_AGENT_CONSTRAINTS = frozenset({LIVE_JOB_CONSTRAINT, LIVE_KEY_CONSTRAINT})


def live_agent_taken(exc: BaseException) -> bool:
    """True when ``exc`` is the unique violation of a job, or an idempotency key, that has a live
    agent already (the batch is then decided again reading those agents under the lock)."""
    diag = getattr(exc, "diag", None)
    return (
        isinstance(exc, psycopg.errors.UniqueViolation)
        and diag is not None
        and diag.constraint_name in LIVE_AGENT_CONSTRAINTS
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
