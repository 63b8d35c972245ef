"""Idle warm agents: finding them and binding one to a job by compare-and-swap (SPEC c)."""

from __future__ import annotations

from collections.abc import Iterable

from agents.choices import AgentState

from .rows import dict_rows


def idle_warm_agents(cursor, scaler_ids: Iterable[int]) -> list[dict]:
    """Idle warm agents (running, warm, unbound, no active jobs) of ``scaler_ids``, oldest first,
    with their reservation shape."""
    ids = list(scaler_ids)
    if not ids:
        return []
    return dict_rows(
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
