"""A real container spawn on the private dockerd that registers with a live console: its labels,
lifecycle events, isolation rules, and teardown."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_NAME, ensure_isolated_network
from scalers.jobs import enqueue_spawn
from scalers.lifecycle import teardown_agent
from scalers.models import Installation, Reservation
from tests.support.containers import register_at_network_stage, remove_test_containers
from tests.support.nft import nft_table_for
from tests.support.scalers import make_agent, make_scaler
from tests.support.servers import free_port, wsgi_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

TABLE = "ctr_kici"


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, TABLE, create=False)


@pytest.fixture(autouse=True)
def no_leftover_containers(docker_client):
    yield
    remove_test_containers(docker_client)


def wait_for(predicate, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def test_a_spawned_busybox_agent_registers_with_the_console_within_10_seconds(
    docker_client, agent_image, nft_table, settings, run_rq_jobs
):
    settings.ALLOWED_HOSTS = ["*"]
    ensure_isolated_network(docker_client)  # the bridge (and 172.30.0.1) exists from here on
    port = free_port(ISOLATED_NETWORK_GATEWAY)
    with wsgi_server(ISOLATED_NETWORK_GATEWAY, port) as url:
        scaler = make_scaler(orchestrator_url=url)
        agent = make_agent(scaler)
        with transaction.atomic():
            enqueue_spawn(agent)
        started = time.monotonic()
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        agent.refresh_from_db()
        assert agent.state in (AgentState.CONNECTING, AgentState.RUNNING), agent.failure_reason

        registered = wait_for(lambda: Agent.objects.filter(pk=agent.pk, state=AgentState.RUNNING).exists(), 10)
        assert registered, (
            f"agent did not register: {ScalerEvent.objects.filter(agent=agent).values_list('type', 'detail')}"
        )
        assert time.monotonic() - started < 10

        agent.refresh_from_db()
        info = docker_client.api.inspect_container(agent.managed_id)
        labels = info["Config"]["Labels"]
        assert labels["kici-managed"] == "true"
        assert labels["kici-scaler-name"] == scaler.name
        assert labels["kici-installation-id"] == Installation.current_id()
        assert labels["kici-instance-id"] == settings.KICI_INSTANCE_ID
        assert labels["kici-agent-id"] == agent.agent_id
        assert labels["kici-labels"] == "ctr,linux"
        assert list(info["NetworkSettings"]["Networks"]) == [ISOLATED_NETWORK_NAME]
        assert info["HostConfig"]["PidsLimit"] == 4096 and info["HostConfig"]["Init"] is True
        assert info["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "8m", "max-file": "2"}}
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        assert env["KICI_ORCHESTRATOR_URL"] == url and env["KICI_AGENT_ID"] == agent.agent_id
        assert env["KICI_AGENT_TOKEN"].startswith("ket_")

        assert agent.ip and agent.ip.startswith("172.30.")
        assert agent.host_access == [f"{ISOLATED_NETWORK_GATEWAY}:53", f"{ISOLATED_NETWORK_GATEWAY}:{port}"]
        rules = nft_table.list_agents()
        assert any(str(a) == agent.ip and r.complete for a, r in rules.items())

        types = list(
            ScalerEvent.objects.filter(agent=agent).order_by("created_at", "id").values_list("type", flat=True)
        )
        backend_types = [t for t in types if t != EventType.REGISTERED]  # registration may overtake "ready"
        assert backend_types[:3] == [EventType.PROVISIONING, EventType.NETWORK, EventType.READY]
        assert EventType.REGISTERED in types
        if EventType.CONNECTING in types:  # stored only while the agent had not registered yet
            assert types.index(EventType.CONNECTING) < types.index(EventType.REGISTERED), types

        # heartbeats arrive (the agent beats every 5 s)
        assert wait_for(lambda: Agent.objects.get(pk=agent.pk).last_heartbeat > agent.registered_at, 15)

        t0 = time.monotonic()
        assert teardown_agent(Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk), "shutdown")
        assert time.monotonic() - t0 < 5, "stop should be fast with an init process"
    assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})
    assert all(str(a) != agent.ip for a in nft_table.list_agents())
    assert not Reservation.objects.filter(agent=agent).exists()
    assert Agent.objects.get(pk=agent.pk).state == AgentState.DESTROYED


def test_an_agent_that_registers_before_its_spawn_finishes_gets_no_connecting_event_after_registered(
    docker_client, agent_image, nft_table, monkeypatch
):
    # The agent registers while its spawn is still at the network stage (a fast agent); "waiting for
    # agent registration" must then not be stored after "agent registered".
    from scalers.jobs import spawn_agent

    agent = make_agent(make_scaler(orchestrator_url="http://127.0.0.1:9/"))
    register_at_network_stage(monkeypatch, agent)
    assert spawn_agent(agent.pk) == "spawned"
    types = list(ScalerEvent.objects.filter(agent=agent).order_by("created_at", "id").values_list("type", flat=True))
    assert types == [EventType.PROVISIONING, EventType.REGISTERED, EventType.NETWORK, EventType.READY], types
    assert Agent.objects.get(pk=agent.pk).state == AgentState.RUNNING
    assert teardown_agent(Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk), "shutdown")
