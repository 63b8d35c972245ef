"""Heartbeats refresh the agent's row on open pages: at most one push per agent per 10 s, and at
once when its active job count changes (the browser's clock advances the age in between)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

import scalers.agent_api
from agents.heartbeats import ROW_PUSH_SECONDS, agent_row_message, row_push_due
from agents.models import Agent
from agents.tokens import mint_registration_token
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def test_a_push_is_due_once_per_ten_second_slot():
    t0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert row_push_due(None, t0)
    assert not row_push_due(t0, t0 + timedelta(seconds=5))
    assert row_push_due(t0 + timedelta(seconds=5), t0 + timedelta(seconds=10))
    assert row_push_due(t0, t0 + timedelta(seconds=30))
    # heartbeats every 5 s: every other one pushes
    beats = [t0 + timedelta(seconds=5 * i + 2) for i in range(12)]
    pushes = sum(row_push_due(prev, now) for prev, now in zip(beats, beats[1:], strict=False))
    assert pushes == 11 * 5 // ROW_PUSH_SECONDS


@pytest.fixture
def pushes(monkeypatch):
    pushed: list[int] = []
    monkeypatch.setattr(scalers.agent_api, "push_heartbeat_row", pushed.append)
    return pushed


@pytest.fixture
def session(client):
    agent = make_agent(make_scaler())
    response = client.post(
        "/api/v1/agents/register",
        data="",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {mint_registration_token(agent)}",
    )
    return agent, response.json()["sessionToken"]


def beat(client, agent, token, body=None):
    return client.post(
        f"/api/v1/agents/{agent.agent_id}/heartbeat",
        data=json.dumps(body or {}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_a_heartbeat_after_a_quiet_spell_pushes_the_row_once(client, session, pushes):
    agent, token = session
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=30))
    assert beat(client, agent, token).status_code == 200
    assert pushes == [agent.pk]
    assert beat(client, agent, token).status_code == 200  # same 10-second slot: throttled
    assert pushes == [agent.pk]


def test_a_changed_active_job_count_pushes_at_once(client, session, pushes):
    agent, token = session
    assert beat(client, agent, token, {"activeJobs": 0}).status_code == 200
    before = len(pushes)
    assert beat(client, agent, token, {"activeJobs": 1}).status_code == 200
    assert len(pushes) == before + 1


def test_the_pushed_row_carries_the_new_heartbeat_time(session):
    agent, _ = session
    now = timezone.now()
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat=now, active_jobs=2)
    message = agent_row_message(Agent.objects.select_related("scaler").get(pk=agent.pk))
    assert message["type"] == "event.message" and message["agent_ref"] == agent.agent_id
    html = message["html"]
    assert html.startswith('<tbody hx-swap-oob="afterbegin:#agent-rows" data-upsert>')
    assert f'<time data-rel datetime="{now.isoformat()}"' in html and 'id="agent-' + agent.agent_id + '"' in html
    assert "event-rows" not in html  # a row update, no event


def test_the_publisher_runs_a_queued_push_after_commit(django_capture_on_commit_callbacks):
    from agents.events import flush_events, push_after_commit

    ran: list[str] = []
    with django_capture_on_commit_callbacks(execute=True):
        push_after_commit(lambda: ran.append("pushed"))
        assert ran == []
    assert flush_events(5) and ran == ["pushed"]
