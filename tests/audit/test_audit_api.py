"""The orchestrator's calls that change something are audit records naming their token."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import transaction
from django.db.backends.signals import connection_created
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from audit.models import AuditRecord
from scalers import api_tokens
from scalers.admission.decide import Request, decide_batch
from scalers.api_tokens import create_token
from tests.scalers.test_warm_pools import warm_agent, warm_scaler
from tests.support.scalers import make_scaler

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("stop_admission_queue", "no_enqueue", "fresh_verdicts"),
]


@pytest.fixture
def fresh_verdicts(settings):
    settings.KICI_API_TOKEN = "env-orchestrator-token"
    api_tokens.forget_verdicts()
    yield
    api_tokens.forget_verdicts()


def post(raw: str, path: str, body: dict):
    return Client().post(
        path, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
    )


def rows():
    return list(AuditRecord.objects.order_by("at", "id").values_list("action", "actor", "actor_kind", "agent_ref"))


def test_an_admitted_scale_a_job_complete_and_a_release_are_recorded_with_the_token_name():
    make_scaler("c", max_agents=5)
    _, raw = create_token("ci-audit", ["scale", "read"])
    first = post(raw, "/api/v1/scale", {"labels": ["linux"], "jobId": "j1"}).json()["agentId"]
    second = post(raw, "/api/v1/scale", {"labels": ["linux"], "jobId": "j2"}).json()["agentId"]
    Agent.objects.filter(agent_id__in=[first, second]).update(state=AgentState.RUNNING, registered_at=timezone.now())
    assert post(raw, f"/api/v1/agents/{first}/job-complete", {"jobId": "j1"}).status_code == 200
    assert post(raw, f"/api/v1/agents/{second}/release", {"reason": "lost it"}).status_code == 200
    assert rows() == [
        ("api.scale", "ci-audit", "token", first),
        ("api.scale", "ci-audit", "token", second),
        ("api.job-complete", "ci-audit", "token", first),
        ("api.release", "ci-audit", "token", second),
    ]
    release = AuditRecord.objects.get(action="api.release")
    assert (release.scaler_name, release.detail) == ("c", 'reason "lost it"')


def test_a_refused_call_leaves_no_record():
    make_scaler("c", max_agents=1)
    _, raw = create_token("ci-audit", ["scale", "read"])
    agent_id = post(raw, "/api/v1/scale", {"labels": ["linux"], "jobId": "j1"}).json()["agentId"]
    assert post(raw, "/api/v1/scale", {"labels": ["linux"], "jobId": "j2"}).status_code == 409  # at capacity
    assert post(raw, f"/api/v1/agents/{agent_id}/job-complete", {"jobId": "other"}).status_code == 409
    assert [r[0] for r in rows()] == ["api.scale"]


def test_a_scale_is_recorded_in_the_transaction_that_admits_it():
    """Decided in the caller's transaction: the record commits or rolls back with the agent."""
    make_scaler("c", max_agents=5)
    with transaction.atomic():
        result = decide_batch([Request(labels=("linux",), job_id="j1", token_name="ci-audit")])
        transaction.set_rollback(True)
    assert result.decisions[0].action == "spawning"
    assert rows() == [] and not Agent.objects.exists()
    result = decide_batch(
        [
            Request(labels=("linux",), job_id="j2", token_name="ci-audit"),
            Request(labels=("linux",), job_id="j3"),  # an internal caller: no token, no record
        ]
    )
    agent_id = result.decisions[0].agent
    assert rows() == [("api.scale", "ci-audit", "token", agent_id)]
    assert AuditRecord.objects.get().detail == "job j2: spawning"


def test_a_warm_hit_is_recorded_and_answered_without_a_connection_of_its_own(settings):
    """The bind and its record are one batch on the decider's connection: the request itself
    opens none (each new connection cost the answer about 10 ms)."""
    agent = warm_agent(warm_scaler(size=1))
    _, raw = create_token("ci-audit", ["scale", "read"])
    opened: list[str] = []

    def count(sender, connection, **kwargs):
        if threading.current_thread().name != "kici-admission":
            opened.append(threading.current_thread().name)

    connection_created.connect(count)
    try:
        r = post(raw, "/api/v1/scale", {"labels": ["linux", "docker"], "jobId": "j1"})
    finally:
        connection_created.disconnect(count)
    assert r.status_code == 200 and r.json()["agentId"] == agent.agent_id, r.content
    assert rows() == [("api.scale", "ci-audit", "token", agent.agent_id)]
    assert AuditRecord.objects.get().detail == "job j1: assigned"
    assert opened == []
