"""A reused agent address keeps its new holder's isolation rules: destroying a dead
agent must not remove a live agent's rules (``scalers.backends.holders``).

Rules are keyed by address. Docker hands a dead container's address to the next container and the
VM allocator hands out the lowest free address, so every path that deletes an address's rules must
first ask who holds it now. Real docker (the private test dockerd), real nft.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess

import pytest
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from network.nft.plan import spec_rule_lines
from scalers.backends.container.backend import ContainerBackend
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_NAME, ensure_isolated_network
from scalers.backends.holders import AGENT, CONTAINER, UNKNOWN, VM, Holder, holders_by_address, other_holders
from scalers.backends.isolation import ContainerIsolation
from scalers.jobs import spawn_agent
from tests.support.containers import remove_test_containers
from tests.support.nft import nft_table_for
from tests.support.scalers import make_agent, make_scaler

TABLE = "sec_kici"


# --- who holds an address (pure) ----------------------------------------------------------------


def _summary(cid, agent_id, address, scaler="ci", state="running"):
    return {
        "Id": cid, "Names": [f"/{agent_id}"], "State": state,
        "Labels": {"kici-managed": "true", "kici-scaler-name": scaler, "kici-agent-id": agent_id},
        "NetworkSettings": {"Networks": {ISOLATED_NETWORK_NAME: {"IPAddress": address}}},
    }  # fmt: skip


def test_every_kind_of_holder_is_found_by_its_address():
    found = holders_by_address(
        agents=[("agent-b", "172.30.0.2", "running"), ("agent-c", "172.30.0.9", "spawning")],
        containers=[
            _summary("c" * 64, "agent-b", "172.30.0.2"),
            {**_summary("d" * 64, "x", "172.30.0.3"), "Labels": {}},
        ],
        allocations=[("10.0.0.2", "vm-1", "fc")],
    )
    assert sorted(found) == ["10.0.0.2", "172.30.0.2", "172.30.0.9"]  # an unlabelled container holds nothing
    assert [(h.kind, h.ident) for h in found["172.30.0.2"]] == [(AGENT, "agent-b"), (CONTAINER, "c" * 64)]
    assert [str(h) for h in found["172.30.0.2"]] == ["agent agent-b (running)", "container agent-b (scaler ci)"]
    assert found["10.0.0.2"] == [Holder(VM, "vm-1", "vm-1", "VM vm-1 (scaler fc)")]


def test_the_sandbox_going_away_is_not_its_own_holder_but_a_new_one_is():
    found = holders_by_address(
        agents=[("agent-a", "172.30.0.2", "destroying"), ("agent-b", "172.30.0.2", "running")],
        containers=[_summary("b" * 64, "agent-b", "172.30.0.2")],
    )["172.30.0.2"]
    assert [h.ident for h in other_holders(found, ["agent-a", "a" * 64])] == ["agent-b", "b" * 64]
    assert other_holders(found, ["agent-a", "agent-b"]) == []
    # Leaving out a container leaves out the agent its label names (a refused registration).
    assert [h.ident for h in other_holders(found, ["b" * 64])] == ["agent-a"]
    unknown = Holder(UNKNOWN, "", "", "unknown: the container runtime could not be listed")
    assert other_holders([unknown], ["anything"]) == [unknown]


# --- containers on the private dockerd -----------------------------------------------------------


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, TABLE)


@pytest.fixture
def clean_containers(docker_client):
    yield
    remove_test_containers(docker_client)


def _rules_in_force(nft, address) -> list[str] | None:
    """The forward and input rules in force for ``address`` (None when incomplete)."""
    rules = nft.list_agents().get(ipaddress.ip_address(address))
    if rules is None or not rules.complete:
        return None
    return [line for line in rules.describe() if not line.startswith("guard:")]


def _bound_ports(nft, address) -> list[str]:
    rules = nft.list_agents().get(ipaddress.ip_address(address))
    return rules.ports if rules is not None else []


def _pin_address(monkeypatch, agent_id: str, address: str) -> None:
    """Make the spawn of ``agent_id`` land on ``address``, as docker does when it reuses a dead
    container's address (the IPAM hands out addresses freed by removed containers)."""
    real = ContainerBackend.create_config

    def create_config(self, agent, token, image, runtime_volume=None, network_id=""):
        kwargs = real(self, agent, token, image, runtime_volume, network_id)
        if agent.agent_id == agent_id:
            kwargs["networking_config"] = {
                "EndpointsConfig": {ISOLATED_NETWORK_NAME: {"IPAMConfig": {"IPv4Address": address}}}
            }
        return kwargs

    monkeypatch.setattr(ContainerBackend, "create_config", create_config)


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_destroying_a_dead_agent_leaves_the_rules_of_the_live_agent_now_on_its_address(
    docker_client, agent_image, nft_table, clean_containers, users, run_rq_jobs, monkeypatch
):
    from operations.choices import OperationStatus, TargetOutcome
    from operations.services import approve_operation, create_operation
    from tests.support.operations import listening_worker

    ensure_isolated_network(docker_client)
    scaler = make_scaler(orchestrator_url=f"http://{ISOLATED_NETWORK_GATEWAY}:9")
    # B's label set opens a different host port, so B's rules are told apart from A's.
    explicit = make_scaler(
        orchestrator_url=f"http://{ISOLATED_NETWORK_GATEWAY}:9",
        ls_config={"image": agent_image, "imagePullPolicy": "Never", "networkPolicy": {"hostAccess": ["*:4444"]}},
    )
    a = make_agent(scaler)
    assert spawn_agent(a.pk) == "spawned", a.failure_reason
    a.refresh_from_db()
    x = a.ip
    assert x and _rules_in_force(nft_table, x)
    Agent.objects.filter(pk=a.pk).update(state=AgentState.RUNNING, registered_at=timezone.now())

    # A dies and its container is gone; the console has not noticed (its row still says running).
    docker_client.api.remove_container(a.managed_id, force=True)
    # Docker gives X to the next container: agent B.
    b = make_agent(explicit)
    _pin_address(monkeypatch, b.agent_id, x)
    assert spawn_agent(b.pk) == "spawned"
    b.refresh_from_db()
    assert b.ip == x
    b_rules = [line for line in spec_rule_lines(_spec(b)) if not line.startswith("warning")]
    # B's spawn replaced A's leftover rules at X in one transaction: exactly B's, nothing of A's.
    assert _rules_in_force(nft_table, x) == b_rules
    assert any("dport 4444" in line for line in b_rules)
    assert b.bridge_port and b.bridge_port in _bound_ports(nft_table, x)
    # The bridge knows X at B's MAC (the spawn taught it): the host's answers reach B at once
    # instead of going to A's old MAC until the kernel's probe, seconds later.
    b_mac = docker_client.api.inspect_container(b.managed_id)["NetworkSettings"]["Networks"][ISOLATED_NETWORK_NAME]
    ip_cmd = ["ip", "-n", nft_table.netns] if nft_table.netns else ["ip"]
    neigh = subprocess.run([*ip_cmd, "neigh", "show", x], capture_output=True, text=True, check=True).stdout
    assert b_mac["MacAddress"].lower() in neigh.lower(), neigh

    # An operator destroys the dead agent A through an approved agent-destroy operation.
    op = create_operation("agent-destroy", {"agent_ids": [a.agent_id]}, users["operator"])
    with listening_worker(op.host_queue):
        approve_operation(op, users["approver"])
    run_rq_jobs(op.host_queue)
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED, op.log
    assert op.outcomes[f"agent:{a.agent_id}"]["outcome"] == TargetOutcome.DONE
    assert Agent.objects.get(pk=a.pk).state == AgentState.DESTROYED

    assert _rules_in_force(nft_table, x) == b_rules, "destroying the dead agent removed the live agent's rules"
    assert b.bridge_port in _bound_ports(nft_table, x), "destroying the dead agent unbound the live agent's port"
    assert docker_client.api.inspect_container(b.managed_id)["State"]["Status"] in ("running", "exited")

    # B's own destroy still removes them: the guard spares holders, not leftovers.
    backend = ContainerBackend(scaler, docker=docker_client)
    backend.destroy(Agent.objects.get(pk=b.pk))
    assert _rules_in_force(nft_table, x) is None and x not in {str(k) for k in nft_table.list_agents()}
    assert _bound_ports(nft_table, x) == []


def _spec(agent):
    """The rule spec the container backend writes for ``agent`` (ContainerIsolation.apply)."""
    from network.nft.spec import AgentSpec

    policy = (agent.label_set.config or {}).get("networkPolicy") or {}
    return AgentSpec.build(agent.ip, ISOLATED_NETWORK_GATEWAY, allowlist=policy.get("allowlist") or [],
                           deny_all=bool(policy.get("denyAll", False)), host_access=agent.host_access)  # fmt: skip


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_the_sweeps_and_a_failed_spawn_cleanup_spare_an_address_an_active_agent_row_holds(
    docker_client, nft_table, settings
):
    ensure_isolated_network(docker_client)
    scaler = make_scaler()
    x = f"172.30.251.{secrets.randbelow(200) + 20}"
    holder = make_agent(scaler, state=AgentState.RUNNING, ip=x)  # no container lists it (yet): the row alone holds X
    isolation = ContainerIsolation(TABLE)
    isolation.apply(x, {}, [f"{ISOLATED_NETWORK_GATEWAY}:53"])
    backend = ContainerBackend(scaler, docker=docker_client)

    assert backend.reap_unowned_isolation_rules() == 0
    assert backend.apply_orphans(backend.plan_rule_orphans()) == 0
    assert backend.apply_orphans([_rule_target(scaler, x)]) == 0  # a plan made before the row existed
    backend.cleanup_failed_spawn(None, x, "scaler-container-00000000")  # another spawn's failure at X
    assert _rules_in_force(nft_table, x), "a sweep removed the rules of an address an active agent holds"

    # A runtime that cannot be listed keeps the rules too (an unknown holder).
    settings.DOCKER_HOST = "unix:///run/sec-no-such-docker.sock"
    blind = ContainerBackend(scaler)
    Agent.objects.filter(pk=holder.pk).update(state=AgentState.DESTROYED)
    other = make_agent(scaler, state=AgentState.DESTROYING, ip=x)
    removed, held = blind.isolation.remove_unless_held(x, exclude=[other.agent_id], list_containers=blind.list_managed)
    assert not removed and [h.kind for h in held] == [UNKNOWN]
    assert _rules_in_force(nft_table, x), "rules removed although the runtime could not be listed"

    Agent.objects.filter(pk=other.pk).update(state=AgentState.DESTROYED)
    assert backend.reap_unowned_isolation_rules() == 1
    assert _rules_in_force(nft_table, x) is None


def _rule_target(scaler, address):
    from scalers.backends.orphans import OrphanTarget

    return OrphanTarget("rule", address, scaler.name, "", "planned earlier", {"address": address})


# --- Firecracker ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_destroying_a_vm_whose_address_was_allocated_again_leaves_the_new_vms_rules(fc_env):
    from network.ipalloc_db import DbIpAllocator
    from scalers.backends.firecracker import jail
    from scalers.backends.firecracker.backend import FirecrackerVm
    from scalers.backends.firecracker.cancel import CancelSignal
    from scalers.backends.firecracker.provision import reapply_isolation_for_tracked_vms
    from tests.support.firecracker import make_agent_row

    env = fc_env
    b = env.backend(jailer="/bin/false", firecracker="/opt/fc/firecracker", kernel="/bin/false", name="fc-sec")
    assert b.ensure_host_ready()
    b.tracked_provider = None
    allocator = DbIpAllocator(env.cidr, env.gateway)
    old, new = "scaler-firecracker-0000e001", "scaler-firecracker-0000e002"
    x = allocator.allocate(old, "fc-sec").ip
    # This process still tracks the old VM with address X; its allocation was released elsewhere
    # (it died) and X went to a new VM, which got its own rules.
    vm = FirecrackerVm(agent_id=old, labels=[], label_set={}, host_access=[f"{env.gateway}:53"],
                       layout=jail.ChrootLayout.for_agent(str(env.base), old), cancel=CancelSignal(),
                       state="running", ip=x, spawn_active=False)  # fmt: skip
    b._vms[old] = vm
    allocator.release(old)
    assert allocator.allocate(new, "fc-sec").ip == x
    make_agent_row("fc-sec", new, state="running")
    Agent.objects.filter(agent_id=new).update(ip=x)
    b.nft.apply_agent(b.rule_spec(x, {}, ["*:4444"]))
    new_rules = _rules_in_force(b.nft, x)

    # A self-heal must not write the old VM's policy over the new VM's rules.
    assert reapply_isolation_for_tracked_vms(b) == 0
    assert _rules_in_force(b.nft, x) == new_rules
    (env.base / "firecracker" / old).mkdir(parents=True, exist_ok=True)
    assert b.destroy(old) is True
    assert _rules_in_force(b.nft, x) == new_rules
    assert new_rules and any("dport 4444" in line for line in new_rules)
