"""Writing a decided batch in one statement: agents, reservations, request records, counters."""

from __future__ import annotations

import json

from agents.choices import AgentState

#: Per-row columns of a new agent, in the order of :class:`NewAgent` tuples.
AGENT_ROW = ("agent_id", "scaler_id", "label_set_id", "labels", "warm", "bound_job_id", "run_id")
AGENT_ROW_TYPES = ("text", "int8", "int8", "text", "bool", "text", "text")
#: Per-row columns of a new reservation (joined to its agent by ``agent_id``).
RESERVATION_ROW = (
    "agent_ref",
    "scaler_id",
    "machine_pool_id",
    "cpus",
    "memory_bytes",
    "limit_cpus",
    "limit_memory_bytes",
)
RESERVATION_ROW_TYPES = ("text", "int8", "int8", "float8", "int8", "float8", "int8")

_WRITE_SQL: str | None = None
_WRITE_DEFAULTS: dict | None = None


def _insert_columns(
    model, per_row: dict[str, str], fixed: dict[str, str], params: dict, prefix: str
) -> tuple[list, list]:
    """Columns and SELECT expressions for an INSERT of ``model`` rows: ``per_row`` maps column ->
    expression over the unnest alias, ``fixed`` column -> named parameter; every other concrete
    column gets its field default (so columns other helpers add keep working)."""
    from django.db import connection

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
            name = f"{prefix}_{col}"
            params[name] = f.get_db_prep_save(f.get_default(), connection)
            exprs.append(f"%({name})s::{f.cast_db_type(connection)}")
    return cols, exprs


def _write_statement() -> tuple[str, dict]:
    """The one statement that writes a decided batch (built once per process from the models)."""
    global _WRITE_SQL, _WRITE_DEFAULTS
    if _WRITE_SQL is not None:
        return _WRITE_SQL, _WRITE_DEFAULTS
    from agents.models import Agent
    from scalers.models import Reservation

    defaults: dict = {}
    a_cols, a_exprs = _insert_columns(
        Agent,
        {
            "agent_id": "u.agent_id",
            "scaler_id": "u.scaler_id",
            "label_set_id": "u.label_set_id",
            "labels": "u.labels::jsonb",
            "warm": "u.warm",
            "bound_job_id": "u.bound_job_id",
            "run_id": "u.run_id",
        },
        {"state": "state", "owner_instance": "owner", "created_at": "now", "updated_at": "now"},
        defaults,
        "a",
    )
    r_cols, r_exprs = _insert_columns(
        Reservation,
        {
            "agent_id": "a.id",
            "scaler_id": "v.scaler_id",
            "machine_pool_id": "v.machine_pool_id",
            "cpus": "v.cpus",
            "memory_bytes": "v.memory_bytes",
            "limit_cpus": "v.limit_cpus",
            "limit_memory_bytes": "v.limit_memory_bytes",
        },
        {"owner_instance": "owner", "created_at": "now"},
        defaults,
        "r",
    )
    a_unnest = ", ".join(f"%(a_{c})b::{t}[]" for c, t in zip(AGENT_ROW, AGENT_ROW_TYPES))
    r_unnest = ", ".join(f"%(r_{c})b::{t}[]" for c, t in zip(RESERVATION_ROW, RESERVATION_ROW_TYPES))
    sql = (
        f"WITH a AS (INSERT INTO agents_agent ({', '.join(a_cols)}) SELECT {', '.join(a_exprs)} "
        f"FROM unnest({a_unnest}) AS u({', '.join(AGENT_ROW)}) ON CONFLICT (agent_id) DO NOTHING RETURNING id, agent_id), "
        f"r AS (INSERT INTO scalers_reservation ({', '.join(r_cols)}) SELECT {', '.join(r_exprs)} "
        f"FROM a JOIN unnest({r_unnest}) AS v({', '.join(RESERVATION_ROW)}) ON v.agent_ref = a.agent_id RETURNING 1), "
        "s AS (INSERT INTO scalers_scalerequest (job_id, run_id, labels, resources, cpus, memory_bytes, outcome, cap, "
        "reason, scaler_name, agent_ref, attempts, owner_instance, first_requested_at, decided_at) "
        "SELECT j, rn, l::jsonb, res::jsonb, c, m, o, cap, reason, sn, ar, n, %(owner)s, %(now)s, %(now)s FROM unnest("
        "%(s_job)b::text[], %(s_run)b::text[], %(s_labels)b::text[], %(s_res)b::text[], %(s_cpus)b::float8[], "
        "%(s_mem)b::int8[], %(s_outcome)b::text[], %(s_cap)b::text[], %(s_reason)b::text[], %(s_scaler)b::text[], "
        "%(s_agent)b::text[], %(s_n)b::int4[]) AS w(j, rn, l, res, c, m, o, cap, reason, sn, ar, n) "
        "ON CONFLICT (job_id) DO UPDATE SET run_id = EXCLUDED.run_id, labels = EXCLUDED.labels, "
        "resources = EXCLUDED.resources, cpus = EXCLUDED.cpus, memory_bytes = EXCLUDED.memory_bytes, "
        "outcome = EXCLUDED.outcome, cap = EXCLUDED.cap, reason = EXCLUDED.reason, scaler_name = EXCLUDED.scaler_name, "
        "agent_ref = EXCLUDED.agent_ref, attempts = scalers_scalerequest.attempts + EXCLUDED.attempts, "
        "owner_instance = EXCLUDED.owner_instance, decided_at = EXCLUDED.decided_at RETURNING 1), "
        "c AS (INSERT INTO scalers_metriccounter (name, label_key, labels, value) "
        "SELECT cn, ck, cl::jsonb, cv FROM unnest(%(c_name)b::text[], %(c_key)b::text[], %(c_labels)b::text[], "
        "%(c_value)b::float8[]) AS x(cn, ck, cl, cv) "
        "ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value RETURNING 1) "
        "SELECT a.id, a.agent_id FROM a"
    )
    _WRITE_SQL, _WRITE_DEFAULTS = sql, defaults
    return sql, defaults


def write_batch(
    cursor,
    *,
    now,
    instance_id: str,
    agents: list[tuple],
    reservations: list[tuple],
    records: list[dict],
    counters: dict[tuple[str, str], tuple[dict, float]],
    count_attempts: bool = True,
) -> dict[str, int]:
    """Write a decided batch in ONE statement: new agents (state spawning), their reservations,
    the request records (one per job id, ``attempts`` summed unless ``count_attempts`` is False)
    and the counter increments.

    ``agents``: tuples in :data:`AGENT_ROW` order (``labels`` as a JSON string);
    ``reservations``: tuples in :data:`RESERVATION_ROW` order. Returns ``{agent_id: pk}`` for the
    agents written: an agent id that already exists is skipped (``ON CONFLICT DO NOTHING``) with
    its reservation, and is missing from the answer; the caller re-mints and writes it again.
    """
    sql, defaults = _write_statement()
    params = dict(defaults)
    params.update(state=str(AgentState.SPAWNING), owner=instance_id, now=now)
    cols = list(zip(*agents)) if agents else [[] for _ in AGENT_ROW]
    for name, values in zip(AGENT_ROW, cols):
        params[f"a_{name}"] = list(values)
    cols = list(zip(*reservations)) if reservations else [[] for _ in RESERVATION_ROW]
    for name, values in zip(RESERVATION_ROW, cols):
        params[f"r_{name}"] = list(values)

    latest: dict[str, dict] = {}
    attempts: dict[str, int] = {}
    for r in records:
        latest[r["job_id"]] = r
        attempts[r["job_id"]] = attempts.get(r["job_id"], 0) + 1
    rows = list(latest.values())
    params.update(
        s_job=[r["job_id"] for r in rows],
        s_run=[r["run_id"] for r in rows],
        s_labels=[json.dumps(r["labels"]) for r in rows],
        s_res=[None if r["resources"] is None else json.dumps(r["resources"]) for r in rows],
        s_cpus=[float(r["cpus"]) for r in rows],
        s_mem=[int(r["memory_bytes"]) for r in rows],
        s_outcome=[r["outcome"] for r in rows],
        s_cap=[r["cap"] for r in rows],
        s_reason=[r["reason"] for r in rows],
        s_scaler=[r["scaler_name"] for r in rows],
        s_agent=[r["agent_ref"] for r in rows],
        s_n=[attempts[r["job_id"]] if count_attempts else 0 for r in rows],
    )
    params.update(
        c_name=[k[0] for k in counters],
        c_key=[k[1] for k in counters],
        c_labels=[json.dumps(v[0]) for v in counters.values()],
        c_value=[float(v[1]) for v in counters.values()],
    )
    cursor.execute(sql, params)
    return {agent_id: pk for pk, agent_id in cursor.fetchall()}
