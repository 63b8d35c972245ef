"""Debug holds (``scalers.holds``): a failing agent of a label set with ``debugHold.onFailure``, or
an agent an approved ``agent-hold`` armed, keeps its sandbox, rules and reservation (counted
against the caps, tracked by the orphan sweeps) instead of being torn down, is shown as held with
who asked, and is torn down by the sweeper when the hold expires or by an approved
``hold-release``; an explicit destroy never holds; ends racing end it once. The backend is a
stand-in that counts its destroys."""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta
from html import unescape
from unittest.mock import patch

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from agents.tokens import mint_session_token
from audit.models import AuditRecord
from operations.jobs import run_operation
from operations.kinds.base import ScopeInvalid
from operations.kinds.lost_agents import teardown_lost_agent
from operations.models import Operation
from operations.services import NothingToDo, approve_operation, create_operation
from scalers.backends.container.tracked import db_tracked_agents
from scalers.backends.docker_net import ISOLATED_NETWORK_NAME, ensure_isolated_network
from scalers.backends.ownership import current_owner
from scalers.drift import KEPT_STATES
from scalers.lifecycle import (
    complete_job,
    fail_connecting,
    fail_spawn,
    reap_expired_holds,
    release_agent,
    release_hold,
    retry_stuck_teardowns,
)
from scalers.models import Reservation
from tests.support.operations import login
from tests.support.scalers import DEFAULT_LABEL_SET_ENTRY, make_agent, make_scaler

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("stop_admission_queue", "empty_queues"),
]

TOKEN = "test-orchestrator-token"
HOLDING = DEFAULT_LABEL_SET_ENTRY | {"debugHold": {"onFailure": True, "durationSeconds": 600}}


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


class CountingBackend:
    """Counts ``destroy`` calls (thread-safe) and records whether the reservation held then."""

    def __init__(self):
        self.lock = threading.Lock()
        self.destroyed: list[tuple[str, bool]] = []

    def destroy(self, agent, reason):
        held = Reservation.objects.filter(agent__agent_id=agent.agent_id).exists()
        with self.lock:
            self.destroyed.append((agent.agent_id, held))


@pytest.fixture
def backend():
    fake = CountingBackend()
    with patch("scalers.lifecycle.get_backend", return_value=fake):
        yield fake


def api(path: str, body: dict):
    return Client().post(
        path, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )


def run(kind: str, users, **scope):
    """Plan ``kind`` as the operator, approve it as the approver and run it here."""
    op = create_operation(kind, scope, users["operator"])
    approve_operation(op, users["approver"], require_worker=False, enqueue=False)
    run_operation(op.pk)
    op.refresh_from_db()
    return op


def fresh(agent) -> Agent:
    return Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk)


def test_a_failing_agent_of_a_holding_label_set_keeps_its_sandbox_rules_and_reservation(backend):
    scaler = make_scaler(ls_config=HOLDING)
    agent = make_agent(scaler, AgentState.CONNECTING, managed_id="c" * 64)
    before = timezone.now()
    assert fail_connecting(agent, "the agent exited 3", reason="spawn-failed", destroy_reason="spawn-timeout")
    held = fresh(agent)
    assert held.state == AgentState.HELD and backend.destroyed == []
    assert Reservation.objects.filter(agent=held).exists()  # still billed: it counts against the caps
    assert before + timedelta(seconds=600) <= held.held_until <= timezone.now() + timedelta(seconds=600)
    assert held.hold["source"] == "label-set" and held.hold["end"] == AgentState.FAILED
    assert "the agent exited 3" in held.failure_reason
    assert agent.agent_id in db_tracked_agents(scaler)  # the orphan sweep spares its container
    assert AgentState.HELD in KEPT_STATES  # the drift check keeps its rules in force
    event = ScalerEvent.objects.get(agent=agent, type=EventType.HELD)
    assert "held by scalers.yaml" in event.detail and "debugHold.onFailure" in event.detail


def test_without_debug_hold_a_failing_agent_is_torn_down_as_before(backend):
    agent = make_agent(make_scaler(), AgentState.CONNECTING, managed_id="c" * 64)
    fail_connecting(agent, "the agent exited 3", reason="spawn-failed", destroy_reason="spawn-timeout")
    assert fresh(agent).state == AgentState.FAILED and backend.destroyed == [(agent.agent_id, True)]
    assert not Reservation.objects.filter(agent=agent).exists()


def test_a_spawning_agent_or_one_without_a_sandbox_is_never_held(backend):
    scaler = make_scaler(ls_config=HOLDING)
    spawning = make_agent(scaler, AgentState.SPAWNING, managed_id="c" * 64)
    fail_spawn(spawning, "stale", reason="stale-prune")
    no_sandbox = make_agent(scaler, AgentState.CONNECTING)
    fail_connecting(no_sandbox, "boom", reason="spawn-failed", destroy_reason="spawn-timeout")
    assert {fresh(spawning).state, fresh(no_sandbox).state} == {AgentState.FAILED}


def test_a_job_reported_failed_holds_the_agent_and_a_successful_one_does_not(backend):
    scaler = make_scaler(ls_config=HOLDING)
    ok = make_agent(scaler, AgentState.RUNNING, managed_id="a" * 64, bound_job_id="job-ok")
    bad = make_agent(scaler, AgentState.RUNNING, managed_id="b" * 64, bound_job_id="job-bad")
    assert api(f"/api/v1/agents/{ok.agent_id}/job-complete", {"jobId": "job-ok"}).status_code == 200
    r = api(f"/api/v1/agents/{bad.agent_id}/job-complete", {"jobId": "job-bad", "result": "failure"})
    assert r.status_code == 200 and r.json()["state"] == "held", r.content
    assert fresh(ok).state == AgentState.DESTROYING  # its teardown job is queued as before
    held = fresh(bad)
    assert held.state == AgentState.HELD and held.hold["endReason"] == "job-complete (the job failed)"
    assert held.hold["end"] == AgentState.DESTROYED  # the agent itself did not fail
    audit = AuditRecord.objects.get(agent_ref=bad.agent_id, action="api.job-complete")
    assert '"failure"' in audit.detail


@pytest.mark.parametrize("result", ["failed", "", 1, True])
def test_a_bad_job_result_is_refused_naming_the_field(result):
    agent = make_agent(make_scaler(), AgentState.RUNNING, bound_job_id="job-1")
    r = api(f"/api/v1/agents/{agent.agent_id}/job-complete", {"jobId": "job-1", "result": result})
    assert r.status_code == 400, r.content
    assert r.json()["error"]["field"] == "result" and "success, failure" in r.json()["error"]["message"]
    assert fresh(agent).state == AgentState.RUNNING


def test_a_held_agent_counts_against_the_caps(backend):
    scaler = make_scaler("c", labels=("linux",), max_agents=1, ls_config=HOLDING)
    agent = make_agent(scaler, AgentState.RUNNING, managed_id="c" * 64, bound_job_id="job-1")
    complete_job(agent.agent_id, "job-1", failed=True)
    assert fresh(agent).state == AgentState.HELD
    r = api("/api/v1/scale", {"labels": ["linux"], "jobId": "job-2"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "at-capacity", r.content
    release_hold(agent.agent_id, "someone")
    r = api("/api/v1/scale", {"labels": ["linux"], "jobId": "job-2"})
    assert r.status_code == 201, r.content


def test_a_held_agent_is_told_to_drain_not_to_stop():
    agent = make_agent(make_scaler(), AgentState.HELD, registered_at=timezone.now(), managed_id="c" * 64)
    session = mint_session_token(agent)
    r = Client().post(
        f"/api/v1/agents/{agent.agent_id}/heartbeat",
        data=json.dumps({"activeJobs": 0}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {session}",
    )
    assert r.status_code == 200 and r.json() == {"state": "held", "drain": True, "stop": False}, r.content


def test_the_sweeper_tears_a_hold_down_when_it_expires_with_the_end_it_spared(backend):
    scaler = make_scaler(ls_config=HOLDING)
    agent = make_agent(scaler, AgentState.CONNECTING, managed_id="c" * 64)
    fail_connecting(agent, "boom", reason="spawn-failed", destroy_reason="spawn-timeout")
    until = fresh(agent).held_until
    assert reap_expired_holds(now=until - timedelta(seconds=1)) == 0
    assert fresh(agent).state == AgentState.HELD and backend.destroyed == []
    assert reap_expired_holds(now=until) == 1
    ended = fresh(agent)
    assert ended.state == AgentState.FAILED and "boom" in ended.failure_reason
    assert backend.destroyed == [(agent.agent_id, True)]  # destroyed while still billed, then released
    assert not Reservation.objects.filter(agent=agent).exists()
    released = ScalerEvent.objects.get(agent=agent, type=EventType.RELEASED)
    assert released.detail == "hold expired (spawn-failed)"


def test_expiry_and_releases_racing_end_a_hold_once(backend):
    agent = make_agent(make_scaler(ls_config=HOLDING), AgentState.RUNNING, managed_id="c" * 64, bound_job_id="j")
    complete_job(agent.agent_id, "j", failed=True)
    Agent.objects.filter(pk=agent.pk).update(held_until=timezone.now() - timedelta(seconds=1))
    start = threading.Barrier(6)
    results: list[object] = []

    def end(which: int) -> None:
        start.wait()
        try:
            results.append(reap_expired_holds() if which % 2 else release_hold(agent.agent_id, f"user-{which}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=end, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(backend.destroyed) == 1, backend.destroyed
    assert sum(1 for r in results if r) == 1, results
    assert fresh(agent).state == AgentState.DESTROYED
    assert ScalerEvent.objects.filter(agent=agent, type=EventType.DESTROYED).count() == 1


def test_an_approved_hold_is_armed_taken_at_the_agents_end_shown_and_released_early(backend, users, client):
    scaler = make_scaler()
    agent = make_agent(
        scaler, AgentState.RUNNING, managed_id="c" * 64, bound_job_id="job-1", registered_at=timezone.now()
    )
    op = run("agent-hold", users, agent_ids=[agent.agent_id], params={"reason": "flaky test in job-1", "seconds": 900})
    assert op.status == "succeeded", op.outcomes
    assert op.plan[0]["evidence"]["registered"] is True
    armed = fresh(agent)
    assert armed.state == AgentState.RUNNING
    assert (armed.hold["by"], armed.hold["approvedBy"], armed.hold["seconds"]) == ("ops-operator", "ops-approver", 900)
    login(client, users["viewer"])
    page = client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert "hold armed by ops-operator, approved by ops-approver" in page and "flaky test in job-1" in page
    hold_cell = page.split('id="agent-hold"', 1)[1].split("</span>", 1)[0]
    assert hold_cell.count("hold armed") == 1, hold_cell  # said once, not as a badge and again

    release_agent(agent.agent_id, "cancelled")  # any end, not only a failure, is held
    held = fresh(agent)
    assert held.state == AgentState.HELD and backend.destroyed == []
    assert held.hold["endReason"] == "released by the orchestrator: cancelled"
    page = client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert "held by ops-operator, approved by ops-approver" in page and "Release hold" not in page  # a viewer
    listing = client.get("/agents/?state=held").content.decode()
    assert agent.agent_id in listing and "held until" in listing
    login(client, users["approver"])
    assert "Release hold…" in client.get(f"/agents/{agent.agent_id}/").content.decode()

    op = run("hold-release", users, agent_ids=[agent.agent_id])
    assert op.status == "succeeded" and op.outcomes[f"agent:{agent.agent_id}"]["outcome"] == "done", op.outcomes
    assert op.plan[0]["evidence"]["registered"] is True  # a held agent's sandbox still runs it
    ended = fresh(agent)
    assert ended.state == AgentState.DESTROYED and backend.destroyed == [(agent.agent_id, True)]
    assert not Reservation.objects.filter(agent=agent).exists()
    destroyed = ScalerEvent.objects.get(agent=agent, type=EventType.DESTROYED)
    assert destroyed.payload["reason"].startswith("hold released by ops-operator (operation #")
    kinds = set(AuditRecord.objects.filter(agent_ref=agent.agent_id).values_list("operation_kind", flat=True))
    assert {"agent-hold", "hold-release"} <= kinds


def test_an_explicit_destroy_ignores_an_armed_hold_and_ends_a_held_agent(backend, users):
    scaler = make_scaler(ls_config=HOLDING)
    armed = make_agent(scaler, AgentState.RUNNING, managed_id="a" * 64)
    run("agent-hold", users, agent_ids=[armed.agent_id], params={"reason": "look inside"})
    held = make_agent(scaler, AgentState.CONNECTING, managed_id="b" * 64)
    fail_connecting(held, "boom", reason="spawn-failed", destroy_reason="spawn-timeout")
    assert fresh(held).state == AgentState.HELD
    op = run("agent-destroy", users, agent_ids=[armed.agent_id, held.agent_id])
    assert op.status == "succeeded", op.outcomes
    assert {fresh(armed).state, fresh(held).state} == {AgentState.DESTROYED}  # an operator ended both
    assert len(backend.destroyed) == 2 and not Reservation.objects.exists()


def test_a_retried_teardown_never_holds(backend):
    agent = make_agent(make_scaler(ls_config=HOLDING), AgentState.DESTROYING, managed_id="c" * 64)
    Agent.objects.filter(pk=agent.pk).update(failure_reason="boom")
    assert retry_stuck_teardowns(min_age_seconds=0, now=timezone.now() + timedelta(minutes=1)) == 1
    assert fresh(agent).state == AgentState.FAILED and len(backend.destroyed) == 1


def refused(kind: str, agent, users, **params) -> str:
    """The reason the planner spared ``agent`` for ``kind`` (nothing to do, nothing stored)."""
    with pytest.raises(NothingToDo) as caught:
        create_operation(kind, {"agent_ids": [agent.agent_id], "params": params}, users["operator"])
    (spared,) = caught.value.plan.spared
    return spared.reason


def test_holds_refused_or_spared_say_why(backend, users):
    scaler = make_scaler()
    ended = make_agent(scaler, AgentState.DESTROYED, reserve=False)
    running = make_agent(scaler, AgentState.RUNNING, managed_id="c" * 64)
    assert "agent is destroyed: nothing to hold" in refused("agent-hold", ended, users, reason="x")
    run("agent-hold", users, agent_ids=[running.agent_id], params={"reason": "first"})
    assert "already hold armed by ops-operator" in refused("agent-hold", running, users, reason="second")
    assert "not held yet" in refused("hold-release", running, users)
    assert "agent is destroyed, not held" in refused("hold-release", ended, users)
    assert release_hold(running.agent_id, "nobody") is False and backend.destroyed == []
    assert not Operation.objects.filter(kind="hold-release").exists()


@pytest.mark.parametrize(
    ("params", "field", "says"),
    [
        ({"reason": "x", "seconds": 10}, "seconds", "from 60 to 86400"),
        ({"reason": "x", "seconds": 86401}, "seconds", "got 86401"),
        ({"reason": "x", "seconds": "2h"}, "seconds", 'got "2h"'),
        ({"reason": "x", "seconds": True}, "seconds", "got true"),
        ({"reason": "  "}, "reason", 'got "  "'),
        ({}, "reason", "got null"),
    ],
)
def test_bad_hold_input_is_refused_naming_the_field_and_value(users, params, field, says):
    agent = make_agent(make_scaler(), AgentState.RUNNING)
    with pytest.raises(ScopeInvalid) as caught:
        create_operation("agent-hold", {"agent_ids": [agent.agent_id], "params": params}, users["operator"])
    assert caught.value.field == field and says in str(caught.value), str(caught.value)


def test_the_hold_form_previews_and_requests_with_its_reason_and_seconds(users, client):
    agent = make_agent(make_scaler(), AgentState.RUNNING, managed_id="c" * 64)
    login(client, users["operator"])
    page = client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert 'id="hold-form"' in page
    fields = {"kind": "agent-hold", "agent": agent.agent_id, "reason": "why not", "seconds": "300"}
    preview = client.post("/operations/plan/", fields)
    assert preview.status_code == 200 and not Operation.objects.exists()
    data: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', preview.content.decode()):
        data.setdefault(name, []).append(unescape(value))
    client.post("/operations/plan/", data)
    op = Operation.objects.get()
    assert (op.kind, op.params) == ("agent-hold", {"reason": "why not", "seconds": 300})
    bad = client.post("/operations/plan/", fields | {"seconds": "soon"})
    assert bad.status_code == 400 and "seconds: must be a whole number" in bad.content.decode()


@pytest.mark.docker
def test_a_held_container_is_spared_by_the_orphan_sweep_and_removed_when_its_hold_expires(
    users, docker_client, agent_image
):
    """With the real container backend: the held agent's container keeps running, an orphan reap
    finds nothing to take (it is tracked), and the expiry removes it and releases the slot."""
    ensure_isolated_network(docker_client)
    api_ = docker_client.api
    scaler = make_scaler(ls_config=HOLDING, config={"networkIsolation": False})
    agent = make_agent(scaler, AgentState.RUNNING, registered_at=timezone.now(), bound_job_id="job-1")
    labels = {"kici-managed": "true", **current_owner(scaler.name).labels(), "kici-agent-id": agent.agent_id}
    host_config = api_.create_host_config(network_mode=ISOLATED_NETWORK_NAME, init=True)
    container = api_.create_container(agent_image, command=["sleep", "600"], labels=labels, host_config=host_config)
    try:
        api_.start(container["Id"])
        Agent.objects.filter(pk=agent.pk).update(managed_id=container["Id"])
        complete_job(agent.agent_id, "job-1", failed=True)
        assert fresh(agent).state == AgentState.HELD
        with pytest.raises(NothingToDo) as caught:
            create_operation("orphan-containers", {"scaler": scaler.name}, users["operator"])
        (spared,) = caught.value.plan.spared
        assert spared.reason.startswith(f"tracked: agent {agent.agent_id} is held"), spared
        assert api_.inspect_container(container["Id"])["State"]["Running"]
        assert reap_expired_holds(now=fresh(agent).held_until) == 1
        assert fresh(agent).state == AgentState.DESTROYED
        assert not api_.containers(all=True, filters={"id": container["Id"]})
        assert not Reservation.objects.filter(agent=agent).exists()
    finally:
        if api_.containers(all=True, filters={"id": container["Id"]}):
            api_.remove_container(container["Id"], force=True)


def test_the_scaler_page_shows_which_label_sets_hold_on_failure(users, client):
    scaler = make_scaler(label_sets=[["linux", "a"], ["linux", "b"]])
    scaler.label_sets.filter(index=0).update(config=HOLDING | {"labels": ["linux", "a"]})
    login(client, users["viewer"])
    page = client.get(f"/scalers/{scaler.name}/").content.decode()
    assert page.count("data-debug-hold") == 1 and "held on failure: 10m 0s" in page


def test_an_agent_lost_by_heartbeat_is_held_and_one_whose_sandbox_is_gone_is_released(backend):
    scaler = make_scaler(ls_config=HOLDING)
    beat = timezone.now() - timedelta(minutes=10)
    silent = make_agent(scaler, AgentState.RUNNING, managed_id="a" * 64, last_heartbeat=beat)
    gone = make_agent(scaler, AgentState.RUNNING, managed_id="b" * 64, last_heartbeat=beat)
    outcome, detail = teardown_lost_agent(
        silent.pk, AgentState.RUNNING, beat, reason="lost", failure_reason="lost (heartbeat)", hold=True
    )
    assert (outcome, fresh(silent).state) == ("done", AgentState.HELD) and "held for debugging" in detail
    outcome, _ = teardown_lost_agent(
        gone.pk, AgentState.RUNNING, beat, reason="lost", failure_reason="lost (sandbox)", hold=False
    )
    assert (outcome, fresh(gone).state) == ("done", AgentState.FAILED)
    assert backend.destroyed == [(gone.agent_id, True)]
    assert Reservation.objects.filter(agent=silent).exists() and not Reservation.objects.filter(agent=gone).exists()


def test_the_hold_form_never_cuts_a_long_reason_the_server_refuses_it_saying_so(users, client):
    from scalers.holds import MAX_REASON

    agent = make_agent(make_scaler(), AgentState.RUNNING, managed_id="c" * 64)
    login(client, users["operator"])
    page = client.get(f"/agents/{agent.agent_id}/").content.decode()
    (field,) = re.findall(r'<input name="reason"[^>]*>', page)
    assert "maxlength" not in field and f"at most {MAX_REASON} characters" in field, field
    fields = {"kind": "agent-hold", "agent": agent.agent_id, "reason": "r" * (MAX_REASON + 1), "seconds": "300"}
    refused = client.post("/operations/plan/", fields)
    assert refused.status_code == 400, refused.status_code
    assert f"reason: must be a non-empty text of at most {MAX_REASON} characters" in unescape(refused.content.decode())
    assert not Operation.objects.exists()
