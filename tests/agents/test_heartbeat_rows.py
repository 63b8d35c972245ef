"""Heartbeats refresh the agent's row on open pages: every heartbeat announces the row (the pages'
consumers batch them, live.rows), and the browser's clock advances the age in between."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

import scalers.agent_api
from agents.heartbeats import agent_row_changed, push_heartbeat_row
from agents.models import Agent
from agents.tokens import mint_registration_token
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


@pytest.fixture
def pushes(monkeypatch):
    pushed: list[int] = []
    monkeypatch.setattr(scalers.agent_api, "push_heartbeat_row", lambda agent: pushed.append(agent.pk))
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


def test_every_heartbeat_announces_the_row(client, session, pushes):
    agent, token = session
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=30))
    assert beat(client, agent, token).status_code == 200
    assert beat(client, agent, token).status_code == 200
    assert beat(client, agent, token, {"activeJobs": 1}).status_code == 200
    assert pushes == [agent.pk] * 3


def test_the_announcement_names_the_agent_and_its_scaler_after_commit(session, django_capture_on_commit_callbacks):
    from agents.events import flush_events

    agent, _ = session
    got: list[dict] = []

    def receiver(sender, **kwargs):
        got.append(kwargs)

    agent_row_changed.connect(receiver, dispatch_uid="test-heartbeat-rows")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            push_heartbeat_row(agent)
            assert got == []
        assert flush_events(5)
    finally:
        agent_row_changed.disconnect(dispatch_uid="test-heartbeat-rows")
    assert [(k["agent_id"], k["scaler_id"]) for k in got] == [(agent.agent_id, agent.scaler_id)]


def test_the_publisher_runs_a_queued_push_after_commit(django_capture_on_commit_callbacks):
    from agents.events import flush_events, push_after_commit

    ran: list[str] = []
    with django_capture_on_commit_callbacks(execute=True):
        push_after_commit(lambda: ran.append("pushed"))
        assert ran == []
    assert flush_events(5) and ran == ["pushed"]
