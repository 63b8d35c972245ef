"""Which API token did what is stored, not only logged: a scale's token name on its request record
and on the agent it admits or binds, a job-complete's and a release's as an ``api.call`` event."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.api_tokens import create_token
from scalers.models import ScaleRequest
from tests.scalers.test_warm_pools import warm_agent, warm_scaler
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]


@pytest.fixture
def token():
    return create_token("ci-east", ["scale", "read"], created_by="admin")[1]


def post(token: str, path: str, body: dict):
    return Client().post(
        path, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def test_a_scale_keeps_its_token_name_on_the_request_record_and_the_agent(token):
    make_scaler("c", labels=("linux",))
    r = post(token, "/api/v1/scale", {"labels": ["linux"], "jobId": "job-1"})
    assert r.status_code == 201, r.content
    assert ScaleRequest.objects.get(job_id="job-1").token_name == "ci-east"
    assert Agent.objects.get(agent_id=r.json()["agentId"]).asked_by_token == "ci-east"


def test_a_refused_scale_keeps_its_token_name_on_the_request_record(token):
    make_scaler("c", labels=("linux",), max_agents=0)
    assert post(token, "/api/v1/scale", {"labels": ["linux"], "jobId": "job-1"}).status_code == 409
    assert ScaleRequest.objects.get(job_id="job-1").token_name == "ci-east"


def test_a_warm_agent_bound_by_a_scale_keeps_the_token_name(token):
    agent = warm_agent(warm_scaler(size=1))
    r = post(token, "/api/v1/scale", {"labels": ["linux", "docker"], "jobId": "job-1"})
    assert r.status_code == 200 and r.json()["agentId"] == agent.agent_id, r.content
    assert Agent.objects.get(pk=agent.pk).asked_by_token == "ci-east"


def test_job_complete_and_release_are_api_call_events_naming_the_token(token, settings):
    settings.KICI_API_TOKEN = "env-token"
    make_scaler("c", labels=("linux",))
    first = post(token, "/api/v1/scale", {"labels": ["linux"], "jobId": "job-1"}).json()["agentId"]
    Agent.objects.filter(agent_id=first).update(state=AgentState.RUNNING)
    assert post(token, f"/api/v1/agents/{first}/job-complete", {"jobId": "job-1"}).status_code == 200
    second = post(token, "/api/v1/scale", {"labels": ["linux"], "jobId": "job-2"}).json()["agentId"]
    assert post("env-token", f"/api/v1/agents/{second}/release", {"reason": "lost it"}).status_code == 200
    calls = {
        (e.agent_ref, e.payload["call"], e.payload["token"], e.detail)
        for e in ScalerEvent.objects.filter(type=EventType.API_CALL)
    }
    assert calls == {
        (first, "job-complete", "ci-east", "job-complete by token ci-east"),
        (second, "release", "KICI_API_TOKEN", "release by token KICI_API_TOKEN"),
    }
