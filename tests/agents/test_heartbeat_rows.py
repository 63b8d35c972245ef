"""Heartbeats refresh the agent's row on open pages: every heartbeat marks the row, the marks go out
together (the pages' consumers batch them again, live.rows), and the browser's clock advances the
age in between."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

import agents.heartbeats
from agents.heartbeats import agent_rows_changed, push_heartbeat_row
from agents.models import Agent
from agents.tokens import mint_registration_token
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


@pytest.fixture
def pushes(monkeypatch):
    pushed: list[int] = []
    monkeypatch.setattr(agents.heartbeats, "push_heartbeat_row", lambda agent: pushed.append(agent.pk))
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

    agent_rows_changed.connect(receiver, dispatch_uid="test-heartbeat-rows")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            push_heartbeat_row(agent)
            assert got == []
        assert flush_events(5)
    finally:
        agent_rows_changed.disconnect(dispatch_uid="test-heartbeat-rows")
    assert [k["rows"] for k in got] == [{agent.agent_id: agent.scaler_id}]


def test_heartbeats_marked_while_the_publisher_is_busy_go_out_as_one_push(django_capture_on_commit_callbacks):
    import threading

    from agents.events import flush_events, push_after_commit

    scaler, other = make_scaler(), make_scaler()
    agents = [make_agent(scaler), make_agent(scaler), make_agent(other)]
    got: list[dict] = []
    busy = threading.Event()
    agent_rows_changed.connect(
        lambda sender, **kw: got.append(kw["rows"]), dispatch_uid="test-heartbeat-rows", weak=False
    )
    try:
        with django_capture_on_commit_callbacks(execute=True):
            push_after_commit(busy.wait)  # the publisher is busy with an earlier push
        for agent in agents * 3:
            with django_capture_on_commit_callbacks(execute=True):
                push_heartbeat_row(agent)
        busy.set()
        assert flush_events(5)
    finally:
        agent_rows_changed.disconnect(dispatch_uid="test-heartbeat-rows")
    assert got == [{a.agent_id: a.scaler_id for a in agents}]


def test_one_push_of_several_rows_tells_each_page_once():
    from live.publish import agent_rows_notices
    from live.rows import AGENTS_GROUP, agent_rows_group, scaler_rows_group

    notices = agent_rows_notices({"a-1": 1, "a-2": 1, "b-1": 2})
    assert notices == [
        (AGENTS_GROUP, {"type": "rows.dirty", "agents": ["a-1", "a-2", "b-1"]}),
        (scaler_rows_group(1), {"type": "rows.dirty", "agents": ["a-1", "a-2"]}),
        (scaler_rows_group(2), {"type": "rows.dirty", "agents": ["b-1"]}),
        (agent_rows_group("a-1"), {"type": "rows.dirty", "agents": ["a-1"]}),
        (agent_rows_group("a-2"), {"type": "rows.dirty", "agents": ["a-2"]}),
        (agent_rows_group("b-1"), {"type": "rows.dirty", "agents": ["b-1"]}),
    ]


def test_the_publisher_runs_a_queued_push_after_commit(django_capture_on_commit_callbacks):
    from agents.events import flush_events, push_after_commit

    ran: list[str] = []
    with django_capture_on_commit_callbacks(execute=True):
        push_after_commit(lambda: ran.append("pushed"))
        assert ran == []
    assert flush_events(5) and ran == ["pushed"]


def test_a_heartbeat_stores_its_time_and_keeps_the_active_jobs_it_does_not_name(client, session):
    agent, token = session
    Agent.objects.filter(pk=agent.pk).update(active_jobs=3, last_heartbeat=timezone.now() - timedelta(minutes=5))
    before = timezone.now()
    assert beat(client, agent, token).status_code == 200
    agent.refresh_from_db()
    assert agent.active_jobs == 3 and agent.last_heartbeat >= before
    assert beat(client, agent, token, {"activeJobs": 0}).status_code == 200
    agent.refresh_from_db()
    assert agent.active_jobs == 0


def test_a_heartbeat_is_one_query_and_its_write_does_not_wait_for_the_wal_flush(client, session):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    agent, token = session
    with CaptureQueriesContext(connection) as queries:
        assert beat(client, agent, token, {"activeJobs": 1}).status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    assert len(sql) == 1, sql
    assert sql[0].startswith("SET LOCAL synchronous_commit TO OFF; UPDATE")


def _refused_beat_writes_nothing(client, agent, token, body, status, pushes):
    """``body`` from ``token`` is answered ``status``; the agent's row and the pages are untouched."""
    stale = timezone.now() - timedelta(minutes=5)
    Agent.objects.filter(pk=agent.pk).update(active_jobs=3, last_heartbeat=stale)
    response = beat(client, agent, token, body)
    assert response.status_code == status, response.content
    agent.refresh_from_db()
    assert (agent.last_heartbeat, agent.active_jobs) == (stale, 3)
    assert pushes == []
    return response.json()


def test_a_heartbeat_with_an_expired_session_token_writes_nothing(client, session, pushes):
    from agents.models import AgentToken
    from agents.tokens import hash_token

    agent, token = session
    AgentToken.objects.filter(token_hash=hash_token(token)).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _refused_beat_writes_nothing(client, agent, token, {"activeJobs": 1}, 401, pushes)["reason"] == "expired"


def test_a_heartbeat_for_another_agent_writes_nothing(client, session, pushes):
    agent, token = session
    other = make_agent(make_scaler(name="other-scaler"))
    response = beat(client, other, token, {"activeJobs": 1})
    assert response.status_code == 401 and response.json()["reason"] == "agent-mismatch"
    other.refresh_from_db()
    assert other.active_jobs != 1 and pushes == []
    _refused_beat_writes_nothing(client, agent, "kas_not-a-known-token", {"activeJobs": 1}, 401, pushes)


def test_a_heartbeat_of_an_ended_agent_writes_nothing_and_says_stop(client, session, pushes):
    agent, token = session
    Agent.objects.filter(pk=agent.pk).update(state="failed")
    answer = _refused_beat_writes_nothing(client, agent, token, {"activeJobs": 1}, 410, pushes)
    assert answer["stop"] is True and answer["state"] == "failed"


def test_a_heartbeat_with_a_bad_body_writes_nothing(client, session, pushes):
    agent, token = session
    answer = _refused_beat_writes_nothing(client, agent, token, {"activeJobs": -1}, 400, pushes)
    assert answer["error"]["field"] == "activeJobs"


def test_pushes_of_marked_rows_are_at_least_the_gap_apart(django_capture_on_commit_callbacks):
    import time

    from agents.events import flush_events
    from agents.heartbeats import ROW_PUSH_GAP_SECONDS

    scaler = make_scaler()
    first, second = make_agent(scaler), make_agent(scaler)
    got: list[tuple[float, dict]] = []
    agent_rows_changed.connect(
        lambda sender, **kw: got.append((time.monotonic(), kw["rows"])), dispatch_uid="test-heartbeat-rows", weak=False
    )
    try:
        for agent in (first, second):
            with django_capture_on_commit_callbacks(execute=True):
                push_heartbeat_row(agent)
            assert flush_events(5)
    finally:
        agent_rows_changed.disconnect(dispatch_uid="test-heartbeat-rows")
    assert [rows for _, rows in got] == [{a.agent_id: a.scaler_id} for a in (first, second)]
    assert ROW_PUSH_GAP_SECONDS > 0 and got[1][0] - got[0][0] >= ROW_PUSH_GAP_SECONDS * 0.95
