"""An idle warm agent's drain (warm-pool idle destroy, retirement) against its bind to a job by
admission: one of the two compare-and-swaps on the agent row wins, and a job never loses the
agent it was given. The backend is a stand-in: what is judged is the rows."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from scalers.admission.ledger import bind_warm_agent
from scalers.lifecycle import drain_and_destroy
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
