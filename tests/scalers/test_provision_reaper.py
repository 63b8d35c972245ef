"""The event-provision reaper, one test per verdict, against a provisioner stub on loopback.

Each provision is real: admitted rows, the spawn run by an rq worker (scale-up delivered over HTTP
to the stub), the claim redeemed and the agent registered through the agent API. Time is moved by
passing ``now`` to the sweep; silence is a last heartbeat that is old at that ``now``. Other
consoles are real PostgreSQL sessions named as their sweepers name theirs (``scalers.leader``).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import django_rq
import psycopg
import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from operations.management.commands.scaler_sweeper import Command
from scalers.jobs import enqueue_spawn
from scalers.leader import Leadership, connected_instances, session_name
from scalers.metrics import (
    EXTERNAL_PROVISION_TIMEOUT,
    REAP_BLOCKED,
    REAP_UNSEEN_PROVISIONS,
    SCALE_DOWN_EMITTED,
)
from scalers.models import MetricCounter, Reservation
from scalers.provision_reaper import ProvisionReaper
from tests.support.provisioner import Provisioner
from tests.support.scalers import make_agent, make_scaler

SECRET = "reaper-test-secret"
SCALE_UP, SCALE_DOWN = "kici.scaler.scale-up", "kici.scaler.scale-down"
GRACE = timedelta(milliseconds=120_000)  # the default flap grace: max(120 s, 2 x 60 s)
STRANDED = timedelta(milliseconds=1_800_000)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def event_settings(settings):
    settings.KICI_PROVISIONING_SECRET = SECRET
    settings.KICI_INSTANCE_ID = "console-a"
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 300


@pytest.fixture
def provisioner():
    p = Provisioner(secret=SECRET)
    yield p
    assert all(p.signed), "every delivery is signed with KICI_PROVISIONING_SECRET"
    p.close()


@pytest.fixture
def peer():
    """Open (and close) the sweeper session of another console: ``peer("console-b")``."""
    sessions = {}

    def open_or_close(instance: str, *, close: bool = False):
        if close:
            sessions.pop(instance).close()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the server ends the backend a moment after the close
                with connection.cursor() as cur:
                    if instance not in connected_instances(cur):
                        return None
                time.sleep(0.02)
            raise AssertionError(f"the session of {instance} is still listed")
        db = connection.settings_dict
        info = {"dbname": db["NAME"], "application_name": session_name(instance), "autocommit": True}
        for key, name in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host"), ("PORT", "port")):
            if db.get(key):
                info[name] = str(db[key])
        sessions[instance] = psycopg.connect(**info)
        return sessions[instance]

    yield open_or_close
    for conn in sessions.values():
        conn.close()


def provision(provisioner, run_rq_jobs, settings) -> Agent:
    """An admitted event agent whose spawn ran in an rq worker: the stub got its scale-up."""
    scaler = make_scaler(type="event", config={"provisioningTargets": [provisioner.url]}, ls_config={})
    agent = make_agent(scaler)
    Agent.objects.filter(pk=agent.pk).update(owner_instance="console-a")
    django_rq.get_queue(settings.KICI_HOST_QUEUE).empty()  # only this spawn runs
    enqueue_spawn(agent)
    run_rq_jobs(settings.KICI_HOST_QUEUE)
    assert len(provisioner.events(SCALE_UP)) == 1
    agent = Agent.objects.select_related("scaler").get(pk=agent.pk)
    assert agent.state == AgentState.CONNECTING, "the spawn job delivered the scale-up and returned"
    return agent


def register(agent: Agent, provisioner, settings, *, via: str) -> None:
    """The provisioned machine redeems its claim and registers through console ``via``."""
    client = Client()
    code = provisioner.events(SCALE_UP)[0]["claimCode"]
    grant = client.post("/api/v1/agents/claim", data=json.dumps({"claimCode": code}), content_type="application/json")
    assert grant.status_code == 200, grant.content
    settings.KICI_INSTANCE_ID = via
    try:
        reg = client.post(
            "/api/v1/agents/register",
            data="",
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {grant.json()['token']}",
        )
    finally:
        settings.KICI_INSTANCE_ID = "console-a"
    assert reg.status_code == 200, reg.content


def counter(name: str, **labels) -> float:
    row = MetricCounter.objects.filter(name=name, labels=labels).first()
    return row.value if row else 0.0


def due(agent: Agent):
    """The first moment the agent is a candidate: its row is older than the spawn timeout."""
    return agent.created_at + timedelta(seconds=301)


def test_a_provision_that_never_registers_is_reaped_for_spawn_timeout_once_unseen_for_the_flap_grace(
    provisioner, run_rq_jobs, settings
):
    agent = provision(provisioner, run_rq_jobs, settings)
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    assert reaper.sweep(agent.created_at + timedelta(seconds=299)).condemned == {}, "not yet a candidate"
    assert agent.agent_id not in reaper.unseen_since
    assert reaper.sweep(t1).condemned == {}, "first unseen: the clock starts"
    assert reaper.sweep(t1 + GRACE - timedelta(seconds=1)).condemned == {}, "inside the flap grace"
    assert counter(REAP_UNSEEN_PROVISIONS) == 0
    assert provisioner.events(SCALE_DOWN) == []

    assert reaper.sweep(t1 + GRACE).condemned == {agent.agent_id: "spawn-timeout"}
    (down,) = provisioner.events(SCALE_DOWN)
    assert down["agentId"] == agent.agent_id and down["reason"] == "spawn-timeout"
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED and not Reservation.objects.filter(agent=agent).exists()
    failed = ScalerEvent.objects.get(agent=agent, type=EventType.FAILED)
    assert "never registered" in failed.detail
    assert counter(EXTERNAL_PROVISION_TIMEOUT, scaler=agent.scaler.name) == 1
    assert counter(SCALE_DOWN_EMITTED, scaler=agent.scaler.name, reason="spawn-timeout") == 1
    reaper.sweep(t1 + GRACE + timedelta(minutes=1))
    assert len(provisioner.events(SCALE_DOWN)) == 1, "an ended provision is no candidate any more"


def test_a_provision_whose_spawn_job_died_before_connecting_is_still_reaped(provisioner, run_rq_jobs, settings):
    agent = provision(provisioner, run_rq_jobs, settings)
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.SPAWNING)  # delivery stored, the move lost
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    reaper.sweep(t1)
    assert reaper.sweep(t1 + GRACE).condemned == {agent.agent_id: "spawn-timeout"}
    assert [d["reason"] for d in provisioner.events(SCALE_DOWN)] == ["spawn-timeout"]
    assert Agent.objects.get(pk=agent.pk).state == AgentState.FAILED


def test_a_provision_that_registers_while_it_is_being_condemned_is_left_running(provisioner, run_rq_jobs, settings):
    agent = provision(provisioner, run_rq_jobs, settings)
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    reaper.sweep(t1)
    judge = reaper._judge

    def judge_then_register(candidate, *args):
        verdict = judge(candidate, *args)
        register(agent, provisioner, settings, via="console-a")  # lands after the candidates were read
        return verdict

    reaper._judge = judge_then_register
    assert reaper.sweep(t1 + GRACE).condemned == {}
    assert provisioner.events(SCALE_DOWN) == []
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING and Reservation.objects.filter(agent=agent).exists()
    assert not ScalerEvent.objects.filter(agent=agent, type=EventType.FAILED).exists()


def test_a_registered_agent_that_heartbeats_is_spared_and_its_unseen_clock_cleared(provisioner, run_rq_jobs, settings):
    agent = provision(provisioner, run_rq_jobs, settings)
    register(agent, provisioner, settings, via="console-b")
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    reaper.sweep(t1)  # its last heartbeat (at registration) is 301 s old: unseen, clock started
    assert agent.agent_id in reaper.unseen_since
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat=t1 + GRACE - timedelta(seconds=5))
    assert reaper.sweep(t1 + GRACE).condemned == {}
    assert agent.agent_id not in reaper.unseen_since, "seen registered: the clock is cleared"
    # Silent again: the clock starts afresh, so one more flap grace must pass before anything happens.
    later = t1 + GRACE + timedelta(seconds=200)
    assert reaper.sweep(later).condemned == {}
    assert provisioner.events(SCALE_DOWN) == []
    assert Agent.objects.get(pk=agent.pk).state == AgentState.RUNNING


def test_a_silent_agent_whose_console_is_gone_is_reaped_for_heartbeat_timeout_after_the_flap_grace(
    provisioner, run_rq_jobs, settings
):
    agent = provision(provisioner, run_rq_jobs, settings)
    register(agent, provisioner, settings, via="console-b")  # console-b never shows a session
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    reaper.sweep(t1)
    assert reaper.sweep(t1 + GRACE - timedelta(seconds=1)).condemned == {}
    assert reaper.sweep(t1 + GRACE).condemned == {agent.agent_id: "heartbeat-timeout"}
    (down,) = provisioner.events(SCALE_DOWN)
    assert down["reason"] == "heartbeat-timeout"
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED and "lost" in agent.failure_reason
    assert not Reservation.objects.filter(agent=agent).exists()
    lost = ScalerEvent.objects.get(agent=agent, type=EventType.LOST)
    assert lost.payload["verdict"] == "heartbeat-timeout" and lost.payload["unseenSeconds"] == 120
    assert counter(SCALE_DOWN_EMITTED, scaler=agent.scaler.name, reason="heartbeat-timeout") == 1
    assert counter(EXTERNAL_PROVISION_TIMEOUT, scaler=agent.scaler.name) == 0


def test_a_silent_agent_whose_console_is_live_waits_out_the_stranded_timeout(provisioner, run_rq_jobs, settings, peer):
    agent = provision(provisioner, run_rq_jobs, settings)
    register(agent, provisioner, settings, via="console-b")
    peer("console-b")
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    reaper.sweep(t1)
    assert reaper.sweep(t1 + GRACE).condemned == {}, "adopted by a live console: not after the grace"
    assert counter(REAP_UNSEEN_PROVISIONS) == 1, "unseen for at least the flap grace"
    assert reaper.sweep(t1 + STRANDED - timedelta(seconds=1)).condemned == {}
    assert reaper.sweep(t1 + STRANDED).condemned == {agent.agent_id: "heartbeat-timeout"}
    assert [d["reason"] for d in provisioner.events(SCALE_DOWN)] == ["heartbeat-timeout"]


def test_a_provision_with_no_owner_recorded_is_spared_and_warned_about_once(provisioner, run_rq_jobs, settings, caplog):
    agent = provision(provisioner, run_rq_jobs, settings)
    Agent.objects.filter(pk=agent.pk).update(owner_instance="")
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    with caplog.at_level(logging.WARNING, logger="scalers.provision_reaper"):
        for step in range(4):
            assert reaper.sweep(t1 + step * GRACE).condemned == {}
    assert provisioner.events(SCALE_DOWN) == []
    assert Agent.objects.get(pk=agent.pk).state == AgentState.CONNECTING
    assert sum("no owner console" in r.getMessage() for r in caplog.records) == 1


def test_a_console_that_knows_peers_but_sees_none_stands_down(provisioner, run_rq_jobs, settings, peer):
    agent = provision(provisioner, run_rq_jobs, settings)
    reaper = ProvisionReaper("console-a")
    t1 = due(agent)
    peer("console-b")
    assert not reaper.sweep(t1).blocked  # console-b is known from now on; the clock starts
    assert counter(REAP_BLOCKED) == 0
    peer("console-b", close=True)
    result = reaper.sweep(t1 + GRACE)
    assert result.blocked and result.condemned == {}
    assert counter(REAP_BLOCKED) == 1 and counter(REAP_UNSEEN_PROVISIONS) == 0
    assert reaper.sweep(t1 + 3 * GRACE).blocked, "still partitioned: still nothing reaped"
    assert provisioner.events(SCALE_DOWN) == []

    peer("console-b")
    assert reaper.sweep(t1 + 4 * GRACE).condemned == {}, "the clock was dropped while blocked: it starts again"
    assert counter(REAP_BLOCKED) == 0
    assert reaper.sweep(t1 + 5 * GRACE).condemned == {agent.agent_id: "spawn-timeout"}


def test_only_the_leading_sweeper_runs_the_reaper_and_a_lost_lead_forgets_its_clocks(
    provisioner, run_rq_jobs, settings
):
    agent = provision(provisioner, run_rq_jobs, settings)
    # Past the spawn timeout, inside the token TTL (claim 300 s + token 600 s) that would expire it.
    Agent.objects.filter(pk=agent.pk).update(created_at=timezone.now() - timedelta(seconds=400))
    leader, follower = Command(), Command()
    leader.handle(once=True, no_warm_pools=True)  # one round as the leader; it lets the lead go on exit
    assert agent.agent_id in leader.reaper.unseen_since, "the leading sweeper's reaper swept"
    assert leader.leadership.poll()[0]
    try:
        follower.handle(once=True, no_warm_pools=True)
        assert follower.reaper.unseen_since == {}, "a sweeper that does not lead does not reap"
    finally:
        leader.leadership.release()
    other = Leadership()
    assert other.poll()[0]
    try:
        leader.tick()  # its next round finds the lead taken
        assert not leader.leading and leader.reaper.unseen_since == {}, "a lost lead forgets its clocks"
    finally:
        other.release()
