"""How a running agent's life ends: its job completes, the orchestrator releases it, or it drains.

* :func:`complete_job`: the orchestrator reports the agent's job done. A single-use agent is torn
  down (``destroyed``, reason ``job-complete``); a warm-pool agent goes back to idle, where the
  pool's idle check keeps it or destroys it like any idle warm agent.
* :func:`release_agent`: the orchestrator gave the agent up; it is torn down.
* :func:`drain_idle_agents` (the sweeper, every round): a ``draining`` agent with no active job
  is torn down.

Every end goes through ``scalers.admission.release.teardown_agent``, which removes the sandbox
before it releases the reservation. A teardown decided in a request is queued on this host's rq
queue; until it runs the agent is ``destroying`` and keeps its slot, and a teardown that fails
is retried by the sweeper (``retry_stuck_teardowns``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from agents.choices import ACTIVE_STATES, TERMINAL_STATES, AgentState
from agents.models import Agent
from scalers.admission.release import teardown_agent
from scalers.jobs import enqueue_teardown

log = logging.getLogger(__name__)


@dataclass
class Refused(Exception):
    """A lifecycle call that cannot be honoured: HTTP ``status``, error ``code``, ``message``."""

    status: int
    code: str
    message: str

    def __str__(self) -> str:
        return self.message


def _locked(agent_id: str) -> Agent:
    agent = Agent.objects.select_for_update().filter(agent_id=agent_id).first()
    if agent is None:
        raise Refused(404, "not-found", f"no agent {agent_id!r}")
    return agent


def _condemn(agent: Agent) -> bool:
    """Move an active agent to ``destroying`` (compare-and-swap); False when it already ended."""
    won = Agent.objects.filter(pk=agent.pk, state__in=ACTIVE_STATES).update(
        state=AgentState.DESTROYING, updated_at=timezone.now()
    )
    if won:
        agent.state = AgentState.DESTROYING
    return bool(won)


def complete_job(agent_id: str, job_id: str) -> Agent:
    """Record that ``job_id`` finished on ``agent_id`` and end or recycle the agent (module doc).

    Idempotent: a repeat for the job already completed answers the agent as it now is. Raises
    :class:`Refused` 404 for an unknown agent, 409 (``job-mismatch``) when the agent is not bound to
    ``job_id``.
    """
    with transaction.atomic():
        agent = _locked(agent_id)
        if agent.completed_job_id == job_id:
            return agent
        if agent.bound_job_id != job_id:
            bound = repr(agent.bound_job_id) if agent.bound_job_id else "no job"
            raise Refused(409, "job-mismatch", f"agent {agent_id} is bound to {bound}, not {job_id!r}")
        agent.completed_job_id = job_id
        fields = {"completed_job_id": job_id, "active_jobs": 0, "updated_at": timezone.now()}
        recycle = agent.warm and agent.state == AgentState.RUNNING and not agent.scaler.retiring
        if recycle:
            fields.update(bound_job_id="", run_id="")
            agent.bound_job_id = agent.run_id = ""
        Agent.objects.filter(pk=agent.pk).update(**fields)
        if agent.state in TERMINAL_STATES or recycle:
            return agent
        if _condemn(agent):
            transaction.on_commit(lambda: enqueue_teardown(agent, "job-complete", destroy_reason="job-complete"))
    return agent


def release_agent(agent_id: str, reason: str) -> Agent:
    """Tear ``agent_id`` down because the orchestrator gave it up (``reason``: its words, kept in
    the release event). Idempotent; raises :class:`Refused` 404 for an unknown agent."""
    with transaction.atomic():
        agent = _locked(agent_id)
        if agent.state in TERMINAL_STATES:
            return agent
        if _condemn(agent):
            why = f"released by the orchestrator: {reason}" if reason else "released by the orchestrator"
            transaction.on_commit(lambda: enqueue_teardown(agent, why, destroy_reason="released"))
    return agent


def drain_idle_agents() -> int:
    """Tear down every ``draining`` agent whose last heartbeat reported no active job. Returns
    how many reservations were released.

    Each agent is taken with a compare-and-swap (still draining, still no active job), so an agent
    that reported a job in the meantime, or that another sweep took, is left alone.
    """
    released = 0
    for agent in Agent.objects.select_related("scaler").filter(state=AgentState.DRAINING, active_jobs=0):
        won = Agent.objects.filter(pk=agent.pk, state=AgentState.DRAINING, active_jobs=0).update(
            state=AgentState.DESTROYING, updated_at=timezone.now()
        )
        if not won:
            continue
        agent.state = AgentState.DESTROYING
        if teardown_agent(agent, "drained", destroy_reason="drain"):
            released += 1
    return released
