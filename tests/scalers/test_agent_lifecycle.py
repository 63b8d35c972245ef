"""How an agent ends through the orchestrator's API and the drain sweep: job-complete, release,
follow an agent (detail and list), and a draining agent with no active job torn down."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from agents.tokens import TokenRejected, mint_registration_token, redeem_registration_token
from scalers.lifecycle import drain_idle_agents
from scalers.models import Reservation
from tests.support.admission import request_scale
from tests.support.scalers import DEFAULT_LABEL_SET_ENTRY, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")]

TOKEN = "test-orchestrator-token"


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


def api(method: str, path: str, body: dict | None = None, token: str | None = TOKEN):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    client = Client()
    if method == "GET":
        return client.get(path, **headers)
    return client.post(path, body if body is not None else {}, content_type="application/json", **headers)


def running_agent(job_id: str = "job-1", *, warm: bool = False) -> Agent:
    """An admitted agent that registered and runs ``job_id`` (no sandbox was created for it)."""
    d = request_scale(["linux"], job_id, resources={"cpus": 1})
    assert d.action == "spawning"
    now = timezone.now()
    Agent.objects.filter(agent_id=d.agent).update(
        state=AgentState.RUNNING, registered_at=now, last_heartbeat=now, warm=warm
    )
    return Agent.objects.select_related("scaler").get(agent_id=d.agent)


def released_reasons(agent) -> list[str]:
    return [e.detail for e in ScalerEvent.objects.filter(agent=agent, type=EventType.RELEASED)]


@pytest.mark.docker
def test_job_complete_tears_a_single_use_agent_down_and_frees_its_slot(docker_client, run_rq_jobs):
    make_scaler("c", max_agents=1)
    agent = running_agent()
    answer = api("POST", f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-1"})
    assert answer.status_code == 200
    assert answer.json()["state"] == "destroying"  # its slot is held until the sandbox is gone
    assert Reservation.objects.count() == 1
    run_rq_jobs()
    agent.refresh_from_db()
    assert agent.state == AgentState.DESTROYED and agent.failure_reason == ""
    assert not Reservation.objects.exists()
    assert released_reasons(agent) == ["job-complete"]
    destroyed = ScalerEvent.objects.get(agent=agent, type=EventType.DESTROYED)
    assert destroyed.detail == "sandbox removed (job-complete)"  # the timeline says how it ended
    assert request_scale(["linux"], "job-2", resources={"cpus": 1}).action == "spawning"  # the slot is free
    again = api("POST", f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-1"})
    assert again.status_code == 200 and again.json()["state"] == "destroyed"  # idempotent
    assert released_reasons(agent) == ["job-complete"]


def test_job_complete_for_another_job_is_409_and_changes_nothing():
    make_scaler("c", max_agents=1)
    agent = running_agent()
    answer = api("POST", f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-other"})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert answer.json()["reason"] == "job-mismatch" and error["field"] == "jobId"  # the request's field at fault
    assert error["message"] == f'agent {agent.agent_id} is bound to "job-1", not "job-other"'
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING and agent.bound_job_id == "job-1"
    assert Reservation.objects.count() == 1


@pytest.mark.parametrize(
    ("call", "body", "field", "message"),
    [
        ("release", {"why": "lost it"}, "why", "why: unknown field (allowed: reason)"),
        (
            "job-complete",
            {"jobId": "job-1", "status": "ok"},
            "status",
            "status: unknown field (allowed: jobId, result)",
        ),
        ("job-complete", {}, "jobId", "jobId: must be a non-empty string, got null"),
        ("release", {"reason": 7}, "reason", "reason: must be a string of at most 500 characters, got 7"),
    ],
)
def test_a_misspelt_or_wrong_field_is_refused_naming_it_and_the_agent_is_left_alone(call, body, field, message):
    make_scaler("c", max_agents=1)
    agent = running_agent()
    answer = api("POST", f"/api/v1/agents/{agent.agent_id}/{call}", body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["field"] == field and answer.json()["error"]["message"].startswith(message)
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING and Reservation.objects.count() == 1


def test_a_warm_agent_serves_one_job_by_default_and_is_torn_down_after_it():
    """Single-use by default: the next job never runs in the sandbox this one left behind."""
    make_scaler("c", max_agents=1)
    agent = running_agent(warm=True)
    answer = api("POST", f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-1"})
    assert answer.status_code == 200 and answer.json()["state"] == "destroying"
    agent.refresh_from_db()
    assert agent.jobs_served == 1 and agent.completed_job_id == "job-1"


def test_a_warm_agent_of_a_label_set_with_max_uses_goes_back_to_idle_until_it_served_them():
    make_scaler("c", max_agents=1, ls_config={**DEFAULT_LABEL_SET_ENTRY, "maxUses": 2})
    agent = running_agent(warm=True)
    answer = api("POST", f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-1"})
    assert answer.status_code == 200
    assert answer.json()["state"] == "running" and answer.json()["jobId"] == ""
    agent.refresh_from_db()
    assert agent.bound_job_id == "" and agent.completed_job_id == "job-1" and agent.jobs_served == 1
    assert Reservation.objects.count() == 1  # an idle warm agent keeps its slot; the pool decides
    again = api("POST", f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-1"})
    assert again.status_code == 200 and again.json()["state"] == "running"  # a repeat counts nothing
    Agent.objects.filter(pk=agent.pk).update(bound_job_id="job-2")  # bound again by admission
    second = api("POST", f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-2"})
    assert second.status_code == 200 and second.json()["state"] == "destroying"
    assert Agent.objects.get(pk=agent.pk).jobs_served == 2


def test_the_scaler_page_says_whether_a_label_set_reuses_its_agents(admin_client):
    make_scaler("single", label_sets=[["a"]])
    make_scaler("reused", label_sets=[["b"]], ls_config={**DEFAULT_LABEL_SET_ENTRY, "maxUses": 5})
    assert ">single-use</span>" in admin_client.get("/scalers/single/").content.decode()
    page = admin_client.get("/scalers/reused/").content.decode()
    assert ">reused: 5 jobs</span>" in page and ">single-use</span>" not in page


@pytest.mark.docker
def test_release_tears_the_agent_down_with_the_orchestrators_reason(docker_client, run_rq_jobs):
    make_scaler("c", max_agents=1)
    agent = running_agent()
    answer = api("POST", f"/api/v1/agents/{agent.agent_id}/release", {"reason": "job cancelled"})
    assert answer.status_code == 200 and answer.json()["state"] == "destroying"
    run_rq_jobs()
    agent.refresh_from_db()
    assert agent.state == AgentState.DESTROYED
    assert released_reasons(agent) == ["released by the orchestrator: job cancelled"]
    assert api("POST", f"/api/v1/agents/{agent.agent_id}/release").json()["state"] == "destroyed"


def test_an_agent_released_before_it_registered_cannot_register_with_its_token(docker_client, run_rq_jobs):
    make_scaler("c", max_agents=1)
    agent = running_agent()
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.CONNECTING, registered_at=None)
    token = mint_registration_token(agent)
    api("POST", f"/api/v1/agents/{agent.agent_id}/release", {"reason": "job cancelled"})
    run_rq_jobs()
    assert Agent.objects.get(pk=agent.pk).state == AgentState.DESTROYED
    with pytest.raises(TokenRejected):  # expired at teardown, not at its TTL
        redeem_registration_token(token)


@pytest.mark.parametrize(
    "method, path, body, status, field",
    [
        ("POST", "/api/v1/agents/nobody/job-complete", {"jobId": "j"}, 404, None),
        ("POST", "/api/v1/agents/nobody/release", {}, 404, None),
        ("GET", "/api/v1/agents/nobody", None, 404, None),
        ("POST", "/api/v1/agents/AGENT/job-complete", {}, 400, "jobId"),
        ("POST", "/api/v1/agents/AGENT/job-complete", {"jobId": 7}, 400, "jobId"),
        ("POST", "/api/v1/agents/AGENT/release", {"reason": ["x"]}, 400, "reason"),
        ("GET", "/api/v1/agents?state=sleeping", None, 400, "state"),
        ("GET", "/api/v1/agents?limit=0", None, 400, "limit"),
        ("GET", "/api/v1/agents?cursor=abc", None, 400, "cursor"),
        ("GET", "/api/v1/agents?cursor=99999999999999999999", None, 400, "cursor"),
        ("GET", "/api/v1/agents?limit=abc", None, 400, "limit"),
        ("GET", "/api/v1/agents?sort=bogus&page=abc", None, 400, "sort"),
        ("GET", "/api/v1/agents?page=abc", None, 400, "page"),
        ("GET", "/api/v1/agents?state=running&state=failed", None, 400, "state"),
        ("GET", "/api/v1/agents/AGENT?verbose=1", None, 400, "verbose"),
        ("GET", "/api/v1/agents/AGENT/job-complete", None, 405, None),
    ],
)
def test_bad_calls_are_refused_naming_the_field(method, path, body, status, field):
    make_scaler("c", max_agents=1)
    agent = running_agent()
    answer = api(method, path.replace("AGENT", agent.agent_id), body)
    assert answer.status_code == status
    assert answer.json()["error"].get("field") == field
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING


def test_every_route_needs_the_orchestrator_token():
    make_scaler("c", max_agents=1)
    agent = running_agent()
    for method, path in (
        ("GET", "/api/v1/agents"),
        ("GET", f"/api/v1/agents/{agent.agent_id}"),
        ("POST", f"/api/v1/agents/{agent.agent_id}/job-complete"),
        ("POST", f"/api/v1/agents/{agent.agent_id}/release"),
    ):
        assert api(method, path, token=None).status_code == 401, path
        assert api(method, path, token="wrong").status_code == 401, path
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING


def test_an_agent_is_followed_by_id_and_listed_by_filter_page_by_page():
    make_scaler("c", max_agents=5)
    agents = [running_agent(f"job-{i}") for i in range(3)]
    one = api("GET", f"/api/v1/agents/{agents[0].agent_id}").json()
    assert one["agentId"] == agents[0].agent_id and one["scaler"] == "c" and one["state"] == "running"
    assert one["jobId"] == "job-0" and one["registeredAt"] and one["activeJobs"] == 0
    assert set(one) == {
        "agentId", "scaler", "state", "labels", "jobId", "warm", "ip", "registeredAt", "lastHeartbeat", "activeJobs",
    }  # fmt: skip
    assert [a["agentId"] for a in api("GET", "/api/v1/agents?jobId=job-1").json()["agents"]] == [agents[1].agent_id]
    seen, cursor = [], ""
    while True:
        page = api("GET", f"/api/v1/agents?scaler=c&state=running&limit=2{cursor}").json()
        seen += [a["agentId"] for a in page["agents"]]
        if page["nextCursor"] is None:
            break
        cursor = f"&cursor={page['nextCursor']}"
    assert seen == [a.agent_id for a in agents]


def test_an_ended_agent_reports_no_address_and_a_live_one_its_own():
    make_scaler("c", max_agents=5)
    live, destroyed, failed = (running_agent(f"job-{i}") for i in range(3))
    Agent.objects.filter(pk=live.pk).update(ip="172.30.0.5")
    now = timezone.now()
    Agent.objects.filter(pk=destroyed.pk).update(state=AgentState.DESTROYED, ip="172.30.0.6", finished_at=now)
    Agent.objects.filter(pk=failed.pk).update(state=AgentState.FAILED, ip="172.30.0.7", finished_at=now)
    # The released address may be the next agent's by now: reporting it would name that agent.
    assert api("GET", f"/api/v1/agents/{live.agent_id}").json()["ip"] == "172.30.0.5"
    assert api("GET", f"/api/v1/agents/{destroyed.agent_id}").json()["ip"] is None
    listed = {a["agentId"]: a["ip"] for a in api("GET", "/api/v1/agents?scaler=c").json()["agents"]}
    assert listed == {live.agent_id: "172.30.0.5", destroyed.agent_id: None, failed.agent_id: None}


@pytest.mark.docker
def test_a_draining_agent_with_no_active_job_is_torn_down_by_the_sweep(docker_client, viewer_client):
    make_scaler("c", max_agents=2)
    idle, busy = running_agent("job-a"), running_agent("job-b")
    Agent.objects.filter(pk__in=[idle.pk, busy.pk]).update(state=AgentState.DRAINING)
    Agent.objects.filter(pk=busy.pk).update(active_jobs=2)
    page = viewer_client.get(f"/agents/{busy.agent_id}/").content.decode()
    assert "waiting for 2 active jobs to finish" in page
    assert drain_idle_agents() == 1
    idle.refresh_from_db()
    busy.refresh_from_db()
    assert idle.state == AgentState.DESTROYED and released_reasons(idle) == ["drained"]
    assert busy.state == AgentState.DRAINING and Reservation.objects.filter(agent=busy).exists()
