"""The isolation drift check (``scalers.drift``): a flushed or edited table under live agents is
repaired from the database within one sweeper round, nothing passes meanwhile, and an agent's first
packet already meets its rules. Real docker (the private test dockerd), real nft, probes from inside
the container's network namespace.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time

import pytest
from django.core.management import call_command

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from network.nft.apply import AgentRules, NftClient
from network.nft.render import policy_chains
from network.nft.spec import AgentSpec
from operations.attention import needs_attention
from scalers.backends.container.backend import ContainerBackend
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ensure_isolated_network
from scalers.drift import REPAIRS, agent_drift, check_isolation_drift
from scalers.jobs import spawn_agent
from scalers.models import MetricCounter
from tests.support.containers import remove_test_containers
from tests.support.network_lab import CountingListener, ProcessNetns, tcp_reachable
from tests.support.nft import nft_table_for
from tests.support.scalers import DEFAULT_LABEL_SET_ENTRY, make_agent, make_scaler
from tests.support.servers import free_port

TABLE = "drift_kici"
GW = ISOLATED_NETWORK_GATEWAY


# --- what counts as drift (pure) -----------------------------------------------------------------


def _found(spec: AgentSpec, **changes) -> AgentRules:
    from network.nft.exprs import forward_rule_exprs, input_rule_exprs

    chains = policy_chains(spec)
    rules = AgentRules(
        address=spec.address, forward=list(forward_rule_exprs(spec)), input=list(input_rule_exprs(spec)),
        forward_chain=chains["fwd"][0], input_chain=chains["in"][0],
        has_forward_chain=True, has_input_chain=True, mapped_forward=True, mapped_input=True,
        bindings=[(spec.port, spec.mac)] if spec.port else [],
    )  # fmt: skip
    for key, value in changes.items():
        setattr(rules, key, value)
    return rules


def test_an_agent_is_in_drift_when_anything_of_its_rules_is_missing_or_changed():
    mac = "02:4b:43:00:00:05"
    spec = AgentSpec.build("172.30.0.5", GW, host_access=[f"{GW}:53", "*:4000"], port="veth1", mac=mac)
    assert agent_drift(spec, _found(spec)) is None
    assert agent_drift(spec, None) == "no rules in the kernel"
    assert agent_drift(spec, _found(spec, mapped_input=False)) == "its chains or map elements are missing"
    unbound = f"its port veth1 with MAC {mac} is not bound"
    assert agent_drift(spec, _found(spec, bindings=[])) == unbound
    assert agent_drift(spec, _found(spec, bindings=[("veth9", mac)])) == unbound
    assert agent_drift(spec, _found(spec, bindings=[("veth1", "02:4b:43:00:00:09")])) == unbound
    unguarded = _found(spec, unguarded_ports=["veth1"])
    assert agent_drift(spec, unguarded) == "its port veth1 is missing from the guarded agent ports"
    flushed = _found(spec, forward=[], input=[])  # what nft flush table leaves: chains, maps, no rules
    assert agent_drift(spec, flushed) == "its rules differ from its policy"
    wider = AgentSpec.build("172.30.0.5", GW, host_access=["*"], port="veth1", mac=mac)
    assert agent_drift(spec, _found(wider)) == "its rules differ from its policy"


# --- live agents on the private dockerd ----------------------------------------------------------


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, TABLE, create=False)


@pytest.fixture
def listeners(docker_client):
    ensure_isolated_network(docker_client)  # the bridge and 172.30.0.1 exist from here on
    here = ProcessNetns(os.getpid())  # the test's own namespace, where the agent bridge is
    made = {name: CountingListener(here, free_port(GW), bind=GW) for name in ("allowed", "forbidden")}
    yield made
    for listener in made.values():
        listener.close()
    remove_test_containers(docker_client)


def _spawn(listeners, docker_client):
    allowed = listeners["allowed"].sock.getsockname()[1]
    scaler = make_scaler(
        orchestrator_url=f"http://{GW}:9",
        ls_config={**DEFAULT_LABEL_SET_ENTRY, "networkPolicy": {"hostAccess": [f"{GW}:{allowed}"]}},
    )
    agent = make_agent(scaler)
    assert spawn_agent(agent.pk) == "spawned", agent.failure_reason
    agent.refresh_from_db()
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.RUNNING)
    pid = docker_client.api.inspect_container(agent.managed_id)["State"]["Pid"]
    ns = ProcessNetns(pid)
    # The container's first ARP for the gateway went out before its port was bound and was
    # dropped; the kernel's retry resolves it within a second or two of the binding.
    port = listeners["allowed"].sock.getsockname()[1]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not tcp_reachable(ns, GW, port, timeout=0.5):
        time.sleep(0.2)
    return agent, ns


def _reach(ns, listeners) -> dict[str, bool]:
    return {name: tcp_reachable(ns, GW, lst.sock.getsockname()[1], timeout=0.5) for name, lst in listeners.items()}


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
@pytest.mark.parametrize("family", ["inet", "bridge"])
def test_a_flushed_table_fails_closed_and_one_drift_check_restores_it(
    docker_client, agent_image, nft_table, listeners, family
):
    agent, ns = _spawn(listeners, docker_client)
    assert agent.bridge_port
    assert _reach(ns, listeners) == {"allowed": True, "forbidden": False}

    subprocess.run(["nft", "flush", "table", family, TABLE], check=True)
    assert _reach(ns, listeners) == {"allowed": False, "forbidden": False}, "a flushed table let traffic through"

    # A flush keeps sets and maps: after an inet flush the agent's chains are empty (its rules are
    # re-applied); after a bridge flush its binding is still there and only the base is.
    (report,) = check_isolation_drift()
    repaired = [agent.agent_id] if family == "inet" else []
    assert report.table == TABLE and report.base and report.agents == repaired
    assert _reach(ns, listeners) == {"allowed": True, "forbidden": False}
    assert check_isolation_drift() == [], "a second check found drift again: the repair is not idempotent"
    counts = dict(MetricCounter.objects.filter(name=REPAIRS).values_list("label_key", "value"))
    expected = {f"kind=base,table={TABLE}": 1} | ({f"kind=agent,table={TABLE}": 1} if repaired else {})
    assert counts == expected
    base_event = ScalerEvent.objects.filter(agent=None, type=EventType.NETWORK).latest("created_at")
    assert base_event.detail.startswith(f"isolation base of table {TABLE} re-applied")
    if repaired:
        event = ScalerEvent.objects.filter(agent=agent, type=EventType.NETWORK).latest("created_at")
        assert event.detail.startswith("isolation rules re-applied from the database")


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_an_agent_whose_rule_was_deleted_by_hand_gets_exactly_its_rules_back_from_the_sweeper(
    docker_client, agent_image, nft_table, listeners
):
    """One sweeper round (``scaler_sweeper --once``) repairs a single agent chain edited by hand:
    the rule that opened its allowed port is gone, then back; the base was intact."""
    agent, ns = _spawn(listeners, docker_client)
    chain = NftClient(TABLE).list_agents()[ipaddress.ip_address(agent.ip)].input_chain
    listing = subprocess.run(
        ["nft", "-a", "list", "chain", "inet", TABLE, chain], check=True, capture_output=True, text=True
    )
    handle = next(line.split("# handle ")[1] for line in listing.stdout.splitlines() if "tcp dport" in line)
    subprocess.run(["nft", "delete", "rule", "inet", TABLE, chain, "handle", handle], check=True)
    assert _reach(ns, listeners)["allowed"] is False
    call_command("scaler_sweeper", "--once")
    assert _reach(ns, listeners) == {"allowed": True, "forbidden": False}
    counts = dict(MetricCounter.objects.filter(name=REPAIRS).values_list("label_key", "value"))
    assert counts == {f"kind=agent,table={TABLE}": 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_a_destroyed_agent_does_not_get_its_rules_back(docker_client, agent_image, nft_table, listeners):
    agent, _ = _spawn(listeners, docker_client)
    scaler = agent.scaler
    ContainerBackend(scaler, docker=docker_client).destroy(agent)
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.DESTROYED)
    assert check_isolation_drift() == []
    assert agent.ip not in {str(a) for a in nft_table.list_agents()}


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_an_agent_whose_first_action_is_a_forbidden_connection_reaches_nothing_before_its_rules(
    docker_client, agent_image, nft_table, listeners, monkeypatch
):
    """The container's command dials the forbidden port from its very first instant, then the
    allowed one, in a loop: the forbidden listener never sees a connection (the guard drops
    everything until the port is bound together with the rules); the allowed one does."""
    forbidden = listeners["forbidden"].sock.getsockname()[1]
    allowed = listeners["allowed"].sock.getsockname()[1]
    real = ContainerBackend.create_config

    def create_config(self, agent, token, image, runtime_volume=None, network_id=""):
        kwargs = real(self, agent, token, image, runtime_volume, network_id)
        loop = f"while :; do nc -w 1 {GW} {forbidden} </dev/null; nc -w 1 {GW} {allowed} </dev/null; done"
        kwargs["command"] = ["sh", "-c", loop]
        return kwargs

    monkeypatch.setattr(ContainerBackend, "create_config", create_config)
    _spawn(listeners, docker_client)
    deadline = time.monotonic() + 10
    while listeners["allowed"].count < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert listeners["allowed"].count >= 3, "the loop never got through: the control failed"
    assert listeners["forbidden"].count == 0, "a connection the policy forbids got through"


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_an_agent_whose_container_is_gone_is_not_repaired_nor_counted_as_tampering(
    docker_client, agent_image, nft_table, listeners
):
    """After a restart the rules of an agent whose container vanished meanwhile are gone with it:
    the drift check leaves them to the lost-agents path, and nothing needs attention for them."""
    agent, _ = _spawn(listeners, docker_client)
    chain = NftClient(TABLE).list_agents()[ipaddress.ip_address(agent.ip)].input_chain
    docker_client.api.remove_container(agent.managed_id, force=True)
    subprocess.run(["nft", "flush", "chain", "inet", TABLE, chain], check=True)

    assert check_isolation_drift() == []
    assert not MetricCounter.objects.filter(name=REPAIRS).exists()
    details = list(ScalerEvent.objects.filter(agent=agent, type=EventType.NETWORK).values_list("detail", flat=True))
    assert not [d for d in details if d.startswith("isolation rules re-applied")], details
    (skipped,) = [d for d in details if d.startswith("isolation rules not restored")]
    assert "its container missing (no such container on the runtime)" in skipped
    listing = subprocess.run(["nft", "list", "chain", "inet", TABLE, chain], check=True, capture_output=True, text=True)
    assert "dport" not in listing.stdout, "the gone agent's rules were re-applied"
    assert needs_attention().counts["isolation"] == 0
    assert check_isolation_drift() == []  # the next round: still left alone, told once
    assert ScalerEvent.objects.filter(agent=agent, detail__startswith="isolation rules not restored").count() == 1
