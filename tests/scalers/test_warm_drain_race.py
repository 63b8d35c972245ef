"""An idle warm agent's drain (warm-pool idle destroy, retirement) against its bind to a job by
admission: one of the two compare-and-swaps on the agent row wins, a job never loses the agent
it was given, and the audit trail names the agent it got. The backend is a stand-in: what is
judged is the rows."""

from __future__ import annotations

import json
from unittest.mock import patch

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from audit.models import AuditRecord
from scalers.admission.ledger import bind_warm_agent
from scalers.lifecycle import drain_and_destroy
from tests.scalers.test_warm_pools import warm_agent, warm_scaler
from tests.support.concurrency import run_threads
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db(transaction=True)


class NoSandbox:
    def destroy(self, agent, reason):
        pass


def idle_warm_agents(n: int) -> list[Agent]:
    scaler = make_scaler(max_agents=n, warm_size=n)
    now = timezone.now()
    return [make_agent(scaler, AgentState.RUNNING, warm=True, registered_at=now, last_heartbeat=now) for _ in range(n)]


def bind(agent: Agent, job_id: str) -> bool:
    with transaction.atomic(), connection.cursor() as cur:
        return bind_warm_agent(cur, agent.pk, job_id, "")


def test_a_warm_agent_bound_before_the_drain_is_kept_with_its_job():
    (agent,) = idle_warm_agents(1)
    assert bind(agent, "job-1")
    with patch("scalers.lifecycle.get_backend", return_value=NoSandbox()):
        assert drain_and_destroy(agent, "warm-pool-idle", destroy_reason="idle") is False
    agent.refresh_from_db()
    assert (agent.state, agent.bound_job_id) == (AgentState.RUNNING, "job-1")


def test_a_drained_warm_agent_cannot_be_bound():
    (agent,) = idle_warm_agents(1)
    with patch("scalers.lifecycle.get_backend", return_value=NoSandbox()):
        assert drain_and_destroy(agent, "warm-pool-idle", destroy_reason="idle") is True
    assert not bind(agent, "job-1")
    agent.refresh_from_db()
    assert (agent.state, agent.bound_job_id) == (AgentState.DESTROYED, "")


def test_binds_and_drains_racing_never_destroy_a_bound_agent():
    agents = idle_warm_agents(20)

    def race(i: int) -> list[bool]:
        if i == 0:
            return [bind(a, f"job-{a.pk}") for a in agents]
        return [drain_and_destroy(a, "warm-pool-idle", destroy_reason="idle") for a in reversed(agents)]

    with patch("scalers.lifecycle.get_backend", return_value=NoSandbox()):
        bound, drained = run_threads(2, race)
    assert not isinstance(bound, BaseException) and not isinstance(drained, BaseException), (bound, drained)
    rows = {a.pk: a for a in Agent.objects.filter(pk__in=[a.pk for a in agents])}
    for agent, was_bound, was_drained in zip(agents, bound, reversed(drained), strict=True):
        row = rows[agent.pk]
        assert was_bound != was_drained, f"{agent.agent_id}: bound {was_bound}, drained {was_drained}"
        if was_bound:
            assert (row.state, row.bound_job_id) == (AgentState.RUNNING, f"job-{agent.pk}")
        else:
            assert (row.state, row.bound_job_id) == (AgentState.DESTROYED, "")


@pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")
def test_warm_hits_racing_drains_bind_each_agent_once_and_audit_exactly_what_was_bound(settings):
    """Jobs asking through the API while the pool's agents are drained: an agent is bound or
    drained, never both, no agent serves two jobs, and the audit trail, written with each batch,
    names exactly the agents the answers gave (a drained candidate's job gets another agent)."""
    settings.KICI_API_TOKEN = "race-token"
    scaler = warm_scaler(size=6, max_agents=6)
    agents = [warm_agent(scaler) for _ in range(6)]

    def race(i: int):
        if i == 0:
            return [drain_and_destroy(a, "warm-pool-idle", destroy_reason="idle") for a in reversed(agents)]
        r = Client().post(
            "/api/v1/scale",
            data=json.dumps({"labels": ["linux", "docker"], "jobId": f"job-{i}"}),
            content_type="application/json",
            HTTP_AUTHORIZATION="Bearer race-token",
        )
        return r.status_code, r.json().get("agentId"), f"job-{i}"

    with patch("scalers.lifecycle.get_backend", return_value=NoSandbox()):
        drained, *answers = run_threads(9, race)
    assert not any(isinstance(r, BaseException) for r in [drained, *answers]), (drained, answers)
    drained_ids = {a.agent_id for a, was in zip(reversed(agents), drained, strict=True) if was}
    bound = {agent_id: job for status, agent_id, job in answers if status == 200}
    assert all(status in (200, 201, 409) for status, _, _ in answers), answers
    assert len(bound) == sum(status == 200 for status, _, _ in answers)  # no agent serves two jobs
    assert not drained_ids & set(bound)
    rows = {a.agent_id: a for a in Agent.objects.filter(pk__in=[a.pk for a in agents])}
    for agent_id, job in bound.items():
        assert (rows[agent_id].state, rows[agent_id].bound_job_id) == (AgentState.RUNNING, job)
    for agent_id in drained_ids:
        assert (rows[agent_id].state, rows[agent_id].bound_job_id) == (AgentState.DESTROYED, "")
    verdict = {200: "assigned", 201: "spawning"}
    expected = {(a, f"job {j}: {verdict[s]}") for s, a, j in answers if s in verdict}
    recorded = list(AuditRecord.objects.filter(action="api.scale").values_list("agent_ref", "detail"))
    assert sorted(recorded) == sorted(expected)
