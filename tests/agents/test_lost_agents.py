"""Lost agents: an agent still running whose container died (or that stopped heartbeating) is found by
the periodic sweep, shown as lost with its evidence, and released through a lost-agents operation
that re-checks the evidence at run time (real docker, real rq, real PostgreSQL)."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.liveness import assess, current_mark
from agents.models import Agent, ScalerEvent
from operations.choices import OperationStatus, RequestedVia, TargetOutcome
from operations.models import Operation
from operations.services import NothingToDo, create_operation
from scalers.backends.ownership import current_owner
from scalers.models import RecoveryReport, Reservation
from tests.support.operations import approve_and_run, outcome
from tests.support.scalers import DEFAULT_LABEL_SET_ENTRY, make_agent, make_scaler

pytestmark = pytest.mark.django_db(transaction=True)

OTHER_SWEEPS = ("ORPHAN_CONTAINERS", "ORPHAN_VMS", "STALE_ISOLATION_RULES", "STALE_RESERVATIONS", "SCALER_RETIREMENT")


@pytest.fixture(autouse=True)
def only_lost_agent_sweeps(monkeypatch, settings):
    import django_rq

    for kind in OTHER_SWEEPS:
        monkeypatch.setenv(f"KICI_SWEEP_{kind}_SECONDS", "0")
    monkeypatch.delenv("KICI_SWEEP_LOST_AGENTS_SECONDS", raising=False)
    monkeypatch.delenv("KICI_AUTO_APPROVE", raising=False)
    settings.KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS = 90
    settings.KICI_LOST_AGENTS_AUTO_RELEASE = True
    for name in settings.RQ_QUEUES:
        django_rq.get_queue(name).empty()


@pytest.fixture
def no_spawn(monkeypatch):
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": None)


def sweep(now=None):
    from operations.sweeps import run_periodic_sweeps

    return run_periodic_sweeps(now or timezone.now())


@pytest.fixture
def container_agent(docker_client, agent_image):
    """``make(scaler) -> (agent, container_id)``: a registered running agent whose container runs
    ``sleep`` on the private dockerd (no network), labelled as the backend labels it."""
    api = docker_client.api
    made = []

    def make(scaler, **fields):
        fields.setdefault("registered_at", timezone.now())
        fields.setdefault("last_heartbeat", timezone.now())
        agent = make_agent(scaler, state=AgentState.RUNNING, **fields)
        c = api.create_container(
            agent_image,
            command=["sleep", "600"],
            name=f"life-{agent.agent_id}",
            host_config=api.create_host_config(network_mode="none", init=True),
            labels={"kici-managed": "true", "kici-agent-id": agent.agent_id, **current_owner(scaler.name).labels()},
        )
        made.append(c["Id"])
        api.start(c["Id"])
        Agent.objects.filter(pk=agent.pk).update(managed_id=c["Id"])
        agent.refresh_from_db()
        return agent, c["Id"]

    yield make
    for cid in made:
        if api.containers(all=True, filters={"id": cid}):
            api.remove_container(cid, force=True)


def docker_scaler(**fields):
    return make_scaler(name=f"life-lost-{secrets.token_hex(2)}", config={"networkIsolation": False}, **fields)


# --- the rule -------------------------------------------------------------------------------------


def test_the_rule_lost_by_a_gone_sandbox_at_once_by_silence_only_past_the_timeout_counted_from_boot():
    now = timezone.now()
    fresh, old = now - timedelta(seconds=3), now - timedelta(seconds=300)
    gone = assess(
        "running", fresh, "exited", now=now, timeout_seconds=90, sandbox_detail="Exited (137)", what="container"
    )
    assert (gone.lost, gone.lost_by, gone.reasons) == (True, "sandbox", ("container exited (Exited (137))",))
    silent = assess("draining", old, "running", now=now, timeout_seconds=90)
    assert (silent.lost, silent.lost_by, silent.silent_seconds) == (True, "heartbeat", 300)
    assert not assess("running", fresh, "running", now=now, timeout_seconds=90).lost
    assert not assess("running", old, "unknown", now=now, timeout_seconds=90, since=now - timedelta(seconds=20)).lost, (
        "a console that booted 20 s ago heard nobody before: no silence verdict yet"
    )
    assert not assess("spawning", old, "missing", now=now, timeout_seconds=90).lost, (
        "only registered agents can be lost"
    )
    assert not assess("failed", old, "missing", now=now, timeout_seconds=90).lost


# --- docker: kill, sweep, approve, run ------------------------------------------------------------


@pytest.mark.docker
def test_a_killed_container_is_planned_by_the_sweep_shown_lost_and_released_so_the_slot_is_usable(
    users, container_agent, docker_client, run_rq_jobs, client, settings, no_spawn
):
    from tests.support.admission import request_scale

    settings.KICI_LOST_AGENTS_AUTO_RELEASE = False  # a person approves here; the default is tested below
    scaler = docker_scaler(max_agents=1)
    agent, cid = container_agent(scaler)
    assert request_scale(["linux", "ctr"], "next-job").action == "at-capacity", "the one slot is taken"
    live = sweep()
    assert live == [], ("a live agent is not lost", [o.plan for o in live])

    docker_client.api.kill(cid)
    assert sweep() == [], "not due yet: one sweep per scope every 30 s"
    t1 = timezone.now() + timedelta(seconds=31)
    (op,) = sweep(t1)
    assert (op.kind, op.status, op.requested_via, op.params) == (
        "lost-agents",
        OperationStatus.PLANNED,
        RequestedVia.SWEEP,
        {"evidence": "sandbox-gone"},
    )
    (target,) = op.plan
    ev = target["evidence"]
    assert target["subject"] == agent.agent_id
    assert (ev["lost_by"], ev["sandbox"], ev["sandbox_gone"], ev["reservation"]) == ("sandbox", "exited", True, True)
    assert ev["last_heartbeat"] == agent.last_heartbeat.isoformat() and ev["heartbeat_age_seconds"] < 90
    assert "container exited" in ev["why"]

    with pytest.raises(NothingToDo) as spared:  # the orphan sweep still spares it: tracked, but says where it goes
        create_operation("orphan-containers", {"scaler": scaler.name}, users["operator"])
    (orphan,) = spared.value.plan.spared
    assert (
        orphan.reason
        == f"tracked: agent {agent.agent_id} is running and registered, but its container is exited: see lost-agents"
    )

    agent.refresh_from_db()
    mark = current_mark(agent)
    assert mark and mark["operation"] == op.pk and mark["lost_by"] == "sandbox"
    (lost_event,) = ScalerEvent.objects.filter(agent=agent, type=EventType.LOST)
    assert "container exited" in lost_event.detail and f"operation #{op.pk}" in lost_event.detail
    client.force_login(users["viewer"])
    row = client.get("/").content.decode().split(f'id="agent-{agent.agent_id}"')[1].split("</tr>")[0]
    assert "data-lost" in row and "container exited" in row and f"operation #{op.pk}" in row
    metrics = client.get("/metrics").content.decode()
    assert f'kici_scaler_lost_agents{{lost_by="sandbox",scaler="{scaler.name}"}} 1.0' in metrics
    page = client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert 'id="lost-evidence"' in page and f"/operations/{op.pk}/" in page
    assert sweep(t1 + timedelta(seconds=31)) == [], "the identical plan is still open"
    assert ScalerEvent.objects.filter(agent=agent, type=EventType.LOST).count() == 1, "one event per lost agent"

    op = approve_and_run(op, users["approver"], run_rq_jobs)
    assert op.status == OperationStatus.SUCCEEDED, (op.error, op.log)
    assert outcome(op, f"agent:{agent.agent_id}") == (
        TargetOutcome.DONE,
        "remains removed, agent failed, reservation released",
    )
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED and agent.failure_reason.startswith("lost (container exited")
    assert not Reservation.objects.filter(agent=agent).exists()
    assert not docker_client.api.containers(all=True, filters={"id": cid}), "the exited container was removed"
    assert current_mark(agent) is None
    assert request_scale(["linux", "ctr"], "next-job").action == "spawning", "the slot is usable again"


@pytest.mark.docker
def test_an_agent_that_heartbeats_after_the_preview_is_skipped_with_the_reason(
    users, container_agent, docker_client, run_rq_jobs, client
):
    from agents.tokens import mint_session_token

    scaler = docker_scaler()
    agent, cid = container_agent(scaler)
    session = mint_session_token(agent)
    docker_client.api.kill(cid)
    op = create_operation("lost-agents", {"scaler": scaler.name}, users["operator"])
    assert [t["subject"] for t in op.plan] == [agent.agent_id]

    time.sleep(0.01)
    beat = client.post(
        f"/api/v1/agents/{agent.agent_id}/heartbeat",
        data=json.dumps({"activeJobs": 0}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {session}",
    )
    assert beat.status_code == 200, beat.content
    op = approve_and_run(op, users["approver"], run_rq_jobs)
    result, detail = outcome(op, f"agent:{agent.agent_id}")
    assert result == TargetOutcome.SKIPPED and "evidence changed since the preview: last_heartbeat" in detail, detail
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING and Reservation.objects.filter(agent=agent).exists()
    assert docker_client.api.containers(all=True, filters={"id": cid}), "nothing was removed"


@pytest.mark.docker
def test_by_default_a_gone_sandbox_is_released_by_policy_and_a_silent_running_one_waits_for_a_person(
    container_agent, docker_client, run_rq_jobs
):
    scaler = docker_scaler()
    dead, dead_cid = container_agent(scaler)
    silent, silent_cid = container_agent(scaler, last_heartbeat=timezone.now() - timedelta(seconds=600))
    alive, _ = container_agent(scaler)
    docker_client.api.kill(dead_cid)

    ops = {op.params["evidence"]: op for op in sweep()}
    assert set(ops) == {"sandbox-gone", "heartbeat"}
    gone, heartbeat = ops["sandbox-gone"], ops["heartbeat"]
    assert (gone.status, gone.auto_approved) == (OperationStatus.APPROVED, True)
    assert [t["subject"] for t in gone.plan] == [dead.agent_id]
    assert heartbeat.status == OperationStatus.PLANNED and not heartbeat.auto_approved
    (t,) = heartbeat.plan
    assert (t["subject"], t["evidence"]["lost_by"], t["evidence"]["sandbox"]) == (
        silent.agent_id,
        "heartbeat",
        "running",
    )
    assert t["evidence"]["heartbeat_age_seconds"] >= 600
    spared = {s["subject"]: s["reason"] for s in heartbeat.spared}
    assert spared[alive.agent_id].startswith("alive: last heartbeat")
    assert spared[dead.agent_id] == "lost, but its sandbox is provably gone: planned under evidence=sandbox-gone"

    run_rq_jobs(gone.host_queue)
    gone.refresh_from_db()
    assert gone.status == OperationStatus.SUCCEEDED, (gone.error, gone.log)
    states = dict(Agent.objects.filter(pk__in=[dead.pk, silent.pk, alive.pk]).values_list("agent_id", "state"))
    assert states == {
        dead.agent_id: AgentState.FAILED,
        silent.agent_id: AgentState.RUNNING,
        alive.agent_id: AgentState.RUNNING,
    }
    assert not docker_client.api.containers(all=True, filters={"id": dead_cid})
    assert docker_client.api.containers(filters={"id": silent_cid}), (
        "a silent agent's running container is left to a person"
    )


# --- the other backends' probes -------------------------------------------------------------------


def test_a_silent_event_agent_is_lost_by_heartbeat_and_a_console_boot_restarts_the_clock(users):
    scaler = make_scaler(name=f"life-ev-{secrets.token_hex(2)}", type="event")
    agent = make_agent(
        scaler,
        state=AgentState.RUNNING,
        registered_at=timezone.now(),
        last_heartbeat=timezone.now() - timedelta(seconds=200),
    )
    op = create_operation("lost-agents", {"scaler": scaler.name}, users["operator"])
    (t,) = op.plan
    assert (t["subject"], t["evidence"]["lost_by"], t["evidence"]["sandbox"]) == (
        agent.agent_id,
        "heartbeat",
        "not probed",
    )

    RecoveryReport.objects.create(instance_id="life", trigger="boot")  # the console just came back
    with pytest.raises(NothingToDo) as exc:
        create_operation("lost-agents", {"scaler": scaler.name}, users["operator"])
    assert exc.value.plan.spared[0].reason.startswith("alive: last heartbeat 2")


def test_a_firecracker_vm_whose_process_exited_is_lost_and_a_running_one_is_not(users, tmp_path):
    scaler = make_scaler(name=f"life-fc-{secrets.token_hex(2)}", type="firecracker")
    roots = {}
    for name in ("dead", "live"):
        roots[name] = tmp_path / name / "root"
        roots[name].mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (roots["dead"] / "firecracker.pid").write_text(str(gone.pid))
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        (roots["live"] / "firecracker.pid").write_text(str(sleeper.pid))
        now = timezone.now()
        dead = make_agent(
            scaler,
            state=AgentState.RUNNING,
            registered_at=now,
            last_heartbeat=now,
            backend_context={"chroot": str(roots["dead"])},
        )
        live = make_agent(
            scaler,
            state=AgentState.RUNNING,
            registered_at=now,
            last_heartbeat=now,
            backend_context={"chroot": str(roots["live"])},
        )
        vanished = make_agent(
            scaler,
            state=AgentState.DRAINING,
            registered_at=now,
            last_heartbeat=now,
            backend_context={"chroot": str(tmp_path / "gone" / "root")},
        )
        op = create_operation(
            "lost-agents", {"scaler": scaler.name, "params": {"evidence": "sandbox-gone"}}, users["operator"]
        )
        plan = {t["subject"]: t["evidence"] for t in op.plan}
        assert set(plan) == {dead.agent_id, vanished.agent_id}
        assert plan[dead.agent_id]["sandbox"] == "exited" and "not running" in plan[dead.agent_id]["sandbox_detail"]
        assert plan[vanished.agent_id]["sandbox"] == "missing"
        assert {s["subject"] for s in op.spared} == {live.agent_id}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_bare_metal_process_that_is_gone_is_lost(users):
    from scalers.backends.sandboxes import probe_sandboxes

    scaler = make_scaler(
        name=f"life-bm-{secrets.token_hex(2)}", type="bare-metal", ls_config={"binaryPath": "/bin/true"}
    )
    gone = subprocess.Popen(["true"])
    gone.wait()
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        now = timezone.now()
        dead = make_agent(
            scaler,
            state=AgentState.RUNNING,
            registered_at=now,
            last_heartbeat=now,
            backend_context={"mode": "process", "pid": gone.pid},
        )
        live = make_agent(
            scaler,
            state=AgentState.RUNNING,
            registered_at=now,
            last_heartbeat=now,
            backend_context={"mode": "process", "pid": sleeper.pid},
        )
        probes = probe_sandboxes(scaler, [dead, live])
        assert (probes[dead.agent_id].state, probes[live.agent_id].state) == ("exited", "running")
        op = create_operation("lost-agents", {"scaler": scaler.name}, users["operator"])
        assert [t["subject"] for t in op.plan] == [dead.agent_id]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_unknown_evidence_scope_is_refused_by_name(users):
    from operations.kinds.base import ScopeInvalid

    with pytest.raises(ScopeInvalid, match="evidence: 'guess' is not one of sandbox-gone, heartbeat"):
        create_operation("lost-agents", {"params": {"evidence": "guess"}}, users["operator"])
    assert Operation.objects.count() == 0


def test_with_debug_hold_a_silent_agent_is_held_and_one_whose_sandbox_is_gone_is_released(
    container_agent, docker_client, run_rq_jobs, users
):
    scaler = docker_scaler(ls_config=DEFAULT_LABEL_SET_ENTRY | {"debugHold": {"onFailure": True}})
    dead, dead_cid = container_agent(scaler)
    silent, silent_cid = container_agent(scaler, last_heartbeat=timezone.now() - timedelta(seconds=600))
    docker_client.api.kill(dead_cid)
    ops = {op.params["evidence"]: op for op in sweep()}
    run_rq_jobs(ops["sandbox-gone"].host_queue)
    held = approve_and_run(ops["heartbeat"], users["approver"], run_rq_jobs)
    result, detail = outcome(held, f"agent:{silent.agent_id}")
    assert result == "done" and "held for debugging" in detail, held.outcomes
    states = dict(Agent.objects.filter(pk__in=[dead.pk, silent.pk]).values_list("agent_id", "state"))
    assert states == {dead.agent_id: AgentState.FAILED, silent.agent_id: AgentState.HELD}
    assert docker_client.api.containers(filters={"id": silent_cid}), "the held sandbox keeps running"
    assert not docker_client.api.containers(all=True, filters={"id": dead_cid})
