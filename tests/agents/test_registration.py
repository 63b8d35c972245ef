"""Agent registration and heartbeat API."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, AgentToken, ScalerEvent
from agents.tokens import hash_token, mint_registration_token
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db

REGISTER = "/api/v1/agents/register"


def post(client, url, token=None, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = json.dumps(body) if body is not None else ""
    return client.post(url, data=data, content_type="application/json", **headers)


@pytest.fixture
def agent():
    return make_agent(make_scaler())


def test_it_registers_an_agent_once_and_marks_it_running(client, agent):
    token = mint_registration_token(agent)
    resp = post(client, REGISTER, token, {"agentId": agent.agent_id})
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["agentId"] == agent.agent_id and body["sessionToken"].startswith("kas_")
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING and agent.registered_at is not None
    assert ScalerEvent.objects.filter(agent=agent, type=EventType.REGISTERED).count() == 1


def test_it_stores_only_the_hash_of_a_token(agent):
    token = mint_registration_token(agent)
    row = AgentToken.objects.get(agent=agent)
    assert row.token_hash == hash_token(token) and token not in (row.token_hash, row.prefix)
    assert row.expires_at > timezone.now() + timedelta(seconds=3000)


def test_it_refuses_a_reused_token(client, agent):
    token = mint_registration_token(agent)
    assert post(client, REGISTER, token).status_code == 200
    again = post(client, REGISTER, token)
    assert again.status_code == 401 and again.json()["reason"] == "used"


def test_it_refuses_an_expired_token(client, agent):
    token = mint_registration_token(agent, ttl_seconds=60)
    AgentToken.objects.filter(agent=agent).update(expires_at=timezone.now() - timedelta(seconds=1))
    resp = post(client, REGISTER, token)
    assert resp.status_code == 401 and resp.json()["reason"] == "expired"
    agent.refresh_from_db()
    assert agent.state == AgentState.SPAWNING


def test_it_refuses_a_missing_or_unknown_token(client, agent):
    assert post(client, REGISTER).status_code == 401
    assert post(client, REGISTER, "ket_nope").json()["reason"] == "unknown"


def test_it_refuses_a_token_presented_for_another_agent(client, agent):
    token = mint_registration_token(agent)
    resp = post(client, REGISTER, token, {"agentId": "scaler-container-ffffffff"})
    assert resp.status_code == 401 and resp.json()["reason"] == "agent-mismatch"


def test_it_answers_409_when_the_spawn_was_given_up(client, agent):
    token = mint_registration_token(agent)
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.FAILED)
    assert post(client, REGISTER, token).status_code == 409


def test_it_rejects_malformed_json(client, agent):
    token = mint_registration_token(agent)
    resp = client.post(REGISTER, data="{nope", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert (
        resp.status_code == 400
        and "JSON" in resp.json()["error"]["message"]
        and resp.json()["error"]["field"] == "body"
    )
    # the token was not burnt by the bad request
    assert post(client, REGISTER, token).status_code == 200


def test_it_records_heartbeats_with_the_session_token(client, agent):
    session = post(client, REGISTER, mint_registration_token(agent)).json()["sessionToken"]
    url = f"/api/v1/agents/{agent.agent_id}/heartbeat"
    resp = post(client, url, session, {"activeJobs": 2})
    assert resp.status_code == 200 and resp.json() == {"state": "running", "drain": False, "stop": False}
    agent.refresh_from_db()
    assert agent.active_jobs == 2 and agent.last_heartbeat is not None


def test_it_refuses_heartbeats_with_the_registration_token_or_for_another_agent(client, agent):
    token = mint_registration_token(agent)
    session = post(client, REGISTER, token).json()["sessionToken"]
    assert post(client, f"/api/v1/agents/{agent.agent_id}/heartbeat", token).status_code == 401
    assert post(client, "/api/v1/agents/scaler-container-00000000/heartbeat", session).status_code == 401


def test_it_rejects_a_bad_active_jobs_count(client, agent):
    session = post(client, REGISTER, mint_registration_token(agent)).json()["sessionToken"]
    for bad in (-1, "3", 10**9, True):
        resp = post(client, f"/api/v1/agents/{agent.agent_id}/heartbeat", session, {"activeJobs": bad})
        assert (
            resp.status_code == 400
            and "activeJobs" in resp.json()["error"]["message"]
            and resp.json()["error"]["field"] == "activeJobs"
        )
    # Without a valid token the body is not looked at: 401, whatever it holds.
    resp = post(client, f"/api/v1/agents/{agent.agent_id}/heartbeat", "bad-token", {"activeJobs": -1})
    assert resp.status_code == 401


def test_it_tells_a_destroyed_agent_to_stop(client, agent):
    session = post(client, REGISTER, mint_registration_token(agent)).json()["sessionToken"]
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.DESTROYED)
    resp = post(client, f"/api/v1/agents/{agent.agent_id}/heartbeat", session)
    assert resp.status_code == 410 and resp.json()["stop"] is True


@pytest.mark.django_db(transaction=True)
def test_a_registration_whose_lookup_fails_is_a_503_and_counted(client, agent):
    """The database cannot be asked (here: the token table is locked by another session past the
    lock timeout): 503 ``lookup-failed``, the token stays unused for the retry, and
    ``kici_orch_scaler_adoption_lookup_failures_total`` counts it."""
    import psycopg
    from django.db import connection

    from scalers.metrics import REGISTRY

    def failures() -> float:
        return REGISTRY.get_sample_value("kici_orch_scaler_adoption_lookup_failures_total") or 0.0

    token = mint_registration_token(agent)
    before = failures()
    params = connection.get_connection_params()
    dsn = {k: params[k] for k in ("host", "port", "user", "dbname") if params.get(k)}
    with psycopg.connect(**dsn) as other:
        other.execute("LOCK TABLE agents_agenttoken IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = '200ms'")
        try:
            resp = post(client, REGISTER, token)
        finally:
            with connection.cursor() as cur:
                cur.execute("RESET lock_timeout")
    assert resp.status_code == 503 and resp.json()["reason"] == "lookup-failed"
    assert failures() == before + 1
    assert post(client, REGISTER, token).status_code == 200
