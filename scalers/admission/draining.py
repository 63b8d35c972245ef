"""Draining one agent before teardown, and retiring scalers removed from the config.

``mark_draining`` / ``clear_draining``: condemn an agent (no new
dispatches) and learn its active-job count; undo when the teardown did not happen. A draining
agent is never bound to a job by admission (only ``running`` agents are).
"""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.utils import timezone

from agents.choices import ACTIVE_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import Agent
from scalers.backends.factory import get_backend
from scalers.models import Reservation, Scaler, ScalerTeardown

from .release import teardown_agent

log = logging.getLogger("scalers.admission")


def mark_draining(agent_id: str) -> int | None:
    """Flag a running agent ``draining`` and return its active-job count.

    Returns ``None`` when the agent is unknown or not running/draining (not registered, or
    already on its way out). Records ``agent.draining`` on the transition.
    """
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "UPDATE agents_agent SET state = %s, updated_at = now() WHERE agent_id = %s AND state = %s "
            "RETURNING id, active_jobs",
            [str(AgentState.DRAINING), agent_id, str(AgentState.RUNNING)],
        )
        row = cur.fetchone()
        if row is not None:
            agent = Agent.objects.select_related("scaler").get(pk=row[0])
            record_event(agent, EventType.DRAINING, detail="condemned before teardown", payload={"activeJobs": row[1]})
            return row[1]
        cur.execute(
            "SELECT active_jobs FROM agents_agent WHERE agent_id = %s AND state = %s",
            [agent_id, str(AgentState.DRAINING)],
        )
        row = cur.fetchone()
        return row[0] if row else None


def clear_draining(agent_id: str) -> None:
    """Undo :func:`mark_draining` when the teardown did not happen (draining ⇒ running)."""
    Agent.objects.filter(agent_id=agent_id, state=AgentState.DRAINING).update(
        state=AgentState.RUNNING, updated_at=timezone.now()
    )


def drain_and_destroy(agent: Agent, reason: str, *, destroy_reason: str = "drain") -> bool:
    """Destroy an idle agent the safe way (used by warm-pool destroys only).

    :func:`mark_draining`; if it has active jobs, :func:`clear_draining` and keep it (False);
    if it is not running, do nothing (False); otherwise :func:`teardown_agent` (True when its
    reservation was released).
    """
    active = mark_draining(agent.agent_id)
    if active is None:
        return False
    if active > 0:
        clear_draining(agent.agent_id)
        return False
    agent.state = AgentState.DRAINING
    return teardown_agent(agent, reason, destroy_reason=destroy_reason)


def retirement_sweep() -> bool:
    """Drain and tear down retiring scalers. Returns True when it did anything.

    For every retiring scaler not yet torn down: idle agents (running, unbound, no active jobs)
    are drained and destroyed; agents working on a job are left to finish. Once the scaler
    holds no active agent and no reservation it is torn down: the backend's optional
    ``teardown()`` runs and a :class:`ScalerTeardown` row is written. A scaler the config
    brought back (no longer retiring) loses its teardown row.
    """
    did = False
    ScalerTeardown.objects.filter(scaler__retiring=False).delete()
    for scaler in Scaler.objects.filter(retiring=True, teardown__isnull=True):
        idle = Agent.objects.select_related("scaler").filter(
            scaler=scaler, state=AgentState.RUNNING, bound_job_id="", active_jobs=0
        )
        for agent in idle:
            if drain_and_destroy(agent, "scaler-retired", destroy_reason="drain"):
                did = True
        if Agent.objects.filter(scaler=scaler, state__in=ACTIVE_STATES).exists():
            continue
        if Reservation.objects.filter(scaler=scaler).exists():
            continue
        detail = ""
        try:
            backend = get_backend(scaler)
            hook = getattr(backend, "teardown", None)
            if callable(hook):
                hook()
                detail = "backend teardown ran"
        except Exception as exc:  # noqa: BLE001 - recorded; the scaler is empty either way
            detail = f"backend teardown failed: {exc}"
            log.warning("retiring scaler %s: %s", scaler.name, detail)
        ScalerTeardown.objects.get_or_create(scaler=scaler, defaults={"detail": detail})
        log.info("retired scaler %s torn down (no agents, no reservations)", scaler.name)
        did = True
    return did
