"""Retention: finished agents, old events and expired tokens are pruned in batches; nothing active,
recent or still holding capacity goes. The provision backoff's event query has its index."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import agents.retention
from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.models import Agent, AgentToken, ScalerEvent
from agents.retention import prune_old_records
from agents.tokens import mint_registration_token
from scalers.models import Reservation
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def aged(agent: Agent, days: float, **fields) -> Agent:
    """Backdate ``agent`` (finished ``days`` ago when terminal), its events and its tokens."""
    then = timezone.now() - timedelta(days=days)
    Agent.objects.filter(pk=agent.pk).update(created_at=then, finished_at=then, **fields)
    ScalerEvent.objects.filter(agent=agent).update(created_at=then)
    AgentToken.objects.filter(agent=agent).update(expires_at=then)
    return agent


def test_old_finished_agents_go_with_their_events_and_tokens_and_nothing_else_does(settings):
    settings.KICI_RETENTION_DAYS = 14
    scaler = make_scaler()
    old = make_agent(scaler, state=AgentState.DESTROYED, reserve=False)
    record_event(old, EventType.RELEASED, "released")
    mint_registration_token(old)
    aged(old, 20)
    recent = aged(make_agent(scaler, state=AgentState.FAILED, reserve=False), 3)
    billed = aged(make_agent(scaler, state=AgentState.FAILED), 20)  # still holds a reservation
    running = aged(make_agent(scaler, state=AgentState.RUNNING), 20)
    record_event(running, EventType.REGISTERED, "registered")
    aged(running, 20)
    counts = prune_old_records()
    assert counts["agents"] == 1
    left = set(Agent.objects.values_list("agent_id", flat=True))
    assert left == {recent.agent_id, billed.agent_id, running.agent_id}
    assert not ScalerEvent.objects.filter(agent_ref=old.agent_id).exists()
    assert not ScalerEvent.objects.filter(agent=running).exists()  # an old event of a live agent goes
    assert Reservation.objects.filter(agent=billed).exists()
    assert prune_old_records() == {"agents": 0, "events": 0, "tokens": 0}


def test_pruning_is_batched_and_the_next_round_takes_the_rest(settings, monkeypatch):
    settings.KICI_RETENTION_DAYS = 1
    monkeypatch.setattr(agents.retention, "BATCH", 2)
    monkeypatch.setattr(agents.retention, "BATCHES_PER_CALL", 2)
    scaler = make_scaler()
    for _ in range(5):
        aged(make_agent(scaler, state=AgentState.DESTROYED, reserve=False), 2)
    assert prune_old_records()["agents"] == 4
    assert prune_old_records()["agents"] == 1
    assert not Agent.objects.exists()


def test_the_backoff_query_reads_the_event_index():
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(
            "EXPLAIN SELECT count(*), max(created_at) FROM agents_scalerevent WHERE scaler_name = %s AND type = %s "
            "AND created_at > now() - interval '1 day'",
            ["ev", str(EventType.FAILED)],
        )
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "event_scaler_type_time" in plan
