"""Each spawn stage made to fail in turn leaves no container, rule or reservation: any failure
records ``scaler.failed`` (with the captured output), removes the rules and force-removes the
container."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, AgentToken, ScalerEvent
from scalers.backends.base import SpawnAborted, SpawnControl
from scalers.backends.container.backend import ContainerBackend
from scalers.jobs import spawn_agent
from scalers.lifecycle import expire_registration
from scalers.models import Reservation
from tests.support.containers import register_at_network_stage, remove_test_containers
from tests.support.nft import nft_table_for
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

TABLE = "ctr_kici_fail"


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, TABLE)


@pytest.fixture(autouse=True)
def no_leftover_containers(docker_client):
    yield
    remove_test_containers(docker_client)


def assert_nothing_left(agent: Agent, docker_client, nft_table):
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED
    assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})
    assert nft_table.list_agents() == {}, "no isolation rule may be left behind"
    assert not Reservation.objects.filter(agent=agent).exists()
    assert ScalerEvent.objects.filter(agent=agent, type=EventType.FAILED).count() == 1
    assert ScalerEvent.objects.filter(agent=agent, type=EventType.RELEASED).exists()
    assert not AgentToken.objects.filter(agent=agent, expires_at__gt=timezone.now()).exists(), "tokens revoked"


def failed_detail(agent: Agent) -> str:
    return ScalerEvent.objects.get(agent=agent, type=EventType.FAILED).detail


def spawn(agent) -> str:
    return spawn_agent(agent.pk)


def test_a_missing_image_fails_before_anything_is_created(docker_client, agent_image, nft_table):
    agent = make_agent(make_scaler(ls_config={"image": "kici-agent:absent", "imagePullPolicy": "Never"}))
    assert spawn(agent) == "failed"
    assert "imagePullPolicy is Never" in failed_detail(agent)
    assert_nothing_left(agent, docker_client, nft_table)


def test_a_failing_create_leaves_nothing(docker_client, agent_image, nft_table):
    agent = make_agent(
        make_scaler(ls_config={"image": agent_image, "imagePullPolicy": "Never", "volumes": ["::not-a-bind::"]})
    )
    assert spawn(agent) == "failed"
    assert "create failed" in failed_detail(agent)
    assert_nothing_left(agent, docker_client, nft_table)


def test_a_failing_start_removes_the_created_container(docker_client, agent_image, nft_table):
    # A file bind-mounted over a directory: accepted by create, refused by the runtime at start.
    agent = make_agent(
        make_scaler(ls_config={"image": agent_image, "imagePullPolicy": "Never", "volumes": ["/etc/hostname:/tmp"]})
    )
    assert spawn(agent) == "failed"
    assert "start failed" in failed_detail(agent)
    assert_nothing_left(agent, docker_client, nft_table)


def test_a_failing_network_stage_removes_the_started_container(docker_client, agent_image, nft_table):
    # A hostname is not a valid hostAccess entry: the rule renderer refuses it at the network stage.
    policy = {"networkPolicy": {"hostAccess": ["registry.internal:5000"]}}
    agent = make_agent(make_scaler(ls_config={"image": agent_image, "imagePullPolicy": "Never", **policy}))
    assert spawn(agent) == "failed"
    detail = failed_detail(agent)
    assert "network failed" in detail and "registry.internal" in detail
    assert_nothing_left(agent, docker_client, nft_table)


def test_an_agent_that_never_registers_is_expired_at_the_deadline(docker_client, agent_image, nft_table, settings):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 3
    # The agent dials its own loopback: nothing listens, no packet leaves the container.
    scaler = make_scaler(orchestrator_url="http://127.0.0.1:9/")
    agent = make_agent(scaler)
    assert spawn(agent) == "spawned"
    agent.refresh_from_db()
    assert agent.ip and any(str(a) == agent.ip for a in nft_table.list_agents())
    assert expire_registration(agent.pk) is False, "not due before the deadline"
    time.sleep(3.2)
    assert expire_registration(agent.pk) is True
    detail = failed_detail(agent)
    assert "did not register within 3 s" in detail
    assert "--- captured output ---" in detail and "kici-agent: registering" in detail
    assert_nothing_left(agent, docker_client, nft_table)


def test_a_spawn_past_its_deadline_stops_before_its_first_runtime_call(docker_client, agent_image, nft_table, settings):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 5
    from datetime import timedelta

    from django.utils import timezone

    agent = make_agent(make_scaler(), spawn_started_at=timezone.now() - timedelta(seconds=6))
    assert spawn(agent) == "failed"
    assert "deadline" in failed_detail(agent)
    assert ScalerEvent.objects.get(agent=agent, type=EventType.FAILED).payload["reason"] == "spawn-timeout"
    assert_nothing_left(agent, docker_client, nft_table)


def test_a_cancelled_agent_is_not_spawned_at_all(docker_client, agent_image, nft_table):
    agent = make_agent(make_scaler())
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.FAILED)
    assert spawn(agent) == "skipped"
    assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})


@pytest.mark.parametrize("cancel_at", ["create", "start", "network", "ready"])
def test_a_spawn_cancelled_between_runtime_calls_cleans_up(docker_client, agent_image, nft_table, cancel_at):
    agent = make_agent(make_scaler(orchestrator_url="http://127.0.0.1:9/"))
    seen: list[str] = []

    def cancelled():
        return "the manager gave up" if seen and seen[-1] == cancel_at else None

    control = SpawnControl(deadline=time.time() + 60, cancelled=cancelled)
    control.stages = seen
    backend = ContainerBackend(agent.scaler, docker=docker_client)
    with pytest.raises(SpawnAborted) as info:
        backend.spawn(agent, control)
    assert info.value.stage == cancel_at and info.value.reason == "cancelled"
    assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})
    assert nft_table.list_agents() == {}


def test_an_agent_that_registered_before_its_network_stage_failed_ends_failed_and_released(
    docker_client, agent_image, nft_table, monkeypatch
):
    # The agent registers as soon as its container starts; the isolation step then fails (a hostname
    # is refused by the rule renderer). The failure path removes the container, so the registered
    # agent must end failed and release its slot, not stay "running" with nothing behind it.

    policy = {"networkPolicy": {"hostAccess": ["registry.internal:5000"]}}
    agent = make_agent(make_scaler(ls_config={"image": agent_image, "imagePullPolicy": "Never", **policy}))
    register_at_network_stage(monkeypatch, agent)
    assert spawn(agent) == "failed"
    types = list(ScalerEvent.objects.filter(agent=agent).order_by("created_at", "id").values_list("type", flat=True))
    assert types.index(EventType.REGISTERED) < types.index(EventType.NETWORK) < types.index(EventType.FAILED), types
    assert "network failed" in failed_detail(agent)
    assert_nothing_left(agent, docker_client, nft_table)
    agent.refresh_from_db()
    assert agent.registered_at is not None and "network failed" in agent.failure_reason


def test_a_container_without_the_requested_mac_fails_at_the_network_stage(
    docker_client, agent_image, nft_table, monkeypatch
):
    """The binding is (port, MAC, address) and the drift check rebuilds the MAC from the agent id:
    a runtime that ignored the requested MAC fails the spawn instead of binding another one."""
    import scalers.backends.container.spawn as spawn_module

    real = spawn_module.container_network_facts

    def other_mac(docker, container_id):
        return real(docker, container_id)._replace(mac="02:4b:43:ff:ff:fe")

    monkeypatch.setattr(spawn_module, "container_network_facts", other_mac)
    agent = make_agent(make_scaler(ls_config={"image": agent_image, "imagePullPolicy": "Never"}))
    assert spawn(agent) == "failed"
    assert "got MAC 02:4b:43:ff:ff:fe on kici-agent-net, not the requested 02:4b:43:" in failed_detail(agent)
    assert_nothing_left(agent, docker_client, nft_table)
