"""The orphan sweep on a docker host shared by two consoles: each removes only its own orphans,
plans then applies with a re-check, and reaps only rules no kici container's address holds."""

from __future__ import annotations

import contextlib
import secrets
import time

import pytest
from django.test import Client
from django.utils import timezone

from agents.archive import archived_lines
from agents.choices import AgentState, EventType
from agents.models import ScalerEvent
from agents.tokens import mint_registration_token
from scalers.backends.container.backend import ContainerBackend
from scalers.backends.container.orphans import OrphanSweepRefused, plan_container_orphans
from scalers.backends.docker_net import ISOLATED_NETWORK_NAME, ensure_isolated_network
from scalers.backends.orphans import OrphanTarget
from scalers.backends.ownership import Owner, current_owner
from tests.support.nft import nft_table_for
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

TEST_LABEL = "ctr-test-orphans"


@pytest.fixture
def box(docker_client, agent_image):
    """Creates labelled busybox containers on kici-agent-net; removes every one at the end."""
    ensure_isolated_network(docker_client)
    api = docker_client.api
    run = secrets.token_hex(3)

    class Box:
        def make(self, labels: dict, state: str = "running") -> str:
            host_config = api.create_host_config(network_mode=ISOLATED_NETWORK_NAME, init=True)
            command = ["sleep", "600"] if state == "running" else ["true"]
            c = api.create_container(
                agent_image, command=command, labels={**labels, TEST_LABEL: run}, host_config=host_config
            )
            if state in ("running", "exited"):
                api.start(c["Id"])
            if state == "exited":
                api.wait(c["Id"], timeout=30)
            return c["Id"]

        def ids(self) -> set[str]:
            return {c["Id"] for c in api.containers(all=True, filters={"label": f"{TEST_LABEL}={run}"})}

    yield Box()
    for c in api.containers(all=True, filters={"label": f"{TEST_LABEL}={run}"}):
        api.remove_container(c["Id"], force=True)


def managed(scaler_name: str | None, agent_id: str | None = None, managed_value: str | None = "true") -> dict:
    """The labels of a container this console made for ``scaler_name`` (owner labels included)."""
    labels = {}
    if managed_value is not None:
        labels["kici-managed"] = managed_value
    if scaler_name is not None:
        labels.update(current_owner(scaler_name).labels())
    if agent_id is not None:
        labels["kici-agent-id"] = agent_id
    return labels


def test_two_consoles_sweeping_1000_times_never_touch_each_others_running_agents(box, docker_client):
    suffix = secrets.token_hex(2)
    a = make_scaler(name=f"ctr-o{suffix}-ci")
    b = make_scaler(name=f"ctr-o{suffix}-ci-2")  # a prefix look-alike of a
    registered_a = make_agent(a, state=AgentState.RUNNING, registered_at=timezone.now())
    spawning_a = make_agent(a, state=AgentState.SPAWNING)
    registered_b = make_agent(b, state=AgentState.RUNNING, registered_at=timezone.now())

    keep = {
        "a running registered": box.make(managed(a.name, registered_a.agent_id)),
        "a running without agent id": box.make(managed(a.name)),
        "b running registered": box.make(managed(b.name, registered_b.agent_id)),
        "empty scaler name": box.make(managed("", "scaler-container-e0000001"), state="exited"),
        "missing scaler name": box.make(managed(None, "scaler-container-e0000002"), state="exited"),
        "upper-case look-alike": box.make(managed(a.name.upper(), "scaler-container-e0000003"), state="exited"),
        "trailing-space look-alike": box.make(managed(a.name + " ", "scaler-container-e0000004"), state="exited"),
        "prefix of a": box.make(managed(a.name[:-1], "scaler-container-e0000005"), state="exited"),
        "not kici-managed": box.make(managed(a.name, "scaler-container-e0000006", managed_value=None), state="exited"),
        "kici-managed empty": box.make(managed(a.name, "scaler-container-e0000007", managed_value=""), state="exited"),
    }
    reap_by_a = {
        "a exited": box.make(managed(a.name, "scaler-container-a0000001"), state="exited"),
        "a created, untracked": box.make(managed(a.name, "scaler-container-a0000002"), state="created"),
        "a running, never registered": box.make(managed(a.name, "scaler-container-a0000003")),
        "a exited, empty agent id": box.make(managed(a.name, ""), state="exited"),
    }
    reap_by_b = {
        "b exited": box.make(managed(b.name, "scaler-container-b0000002"), state="exited"),
        "b running unregistered": box.make(managed(b.name, "scaler-container-b0000001")),
    }
    tracked_created = box.make(managed(a.name, spawning_a.agent_id), state="created")

    console_a = ContainerBackend(a, docker=docker_client, network_isolation=False)
    console_b = ContainerBackend(b, docker=docker_client, network_isolation=False)
    # A restarted console A: nothing tracked in memory and no registry wired (assume registered).
    restarted_a = ContainerBackend(
        a, docker=docker_client, network_isolation=False, tracked_ids=set, is_registered=None
    )

    # Console A tracks its spawning agent (a database row), so its created container is not an orphan;
    # after a restart with an empty view it is one (a local spawn cannot outlive its process).
    assert tracked_created not in {t.target for t in console_a.plan_orphans()}

    removed = {"a": 0, "b": 0, "restarted": 0}
    sweepers = [("restarted", restarted_a), ("b", console_b), ("a", console_a)]
    for i in range(1000):
        name, backend = sweepers[i % 3]
        removed[name] += backend.cleanup_orphans()
        if i < 3:
            continue
        if i % 97 == 0:
            ids = box.ids()
            assert set(keep.values()) <= ids, (i, name, {k for k, v in keep.items() if v not in ids})
    remaining = box.ids()
    assert set(keep.values()) <= remaining, {k for k, v in keep.items() if v not in remaining}
    assert not (set(reap_by_a.values()) | set(reap_by_b.values()) | {tracked_created}) & remaining
    # the restarted console (unwired registry) reaps a's stopped ones but never a running one
    assert removed == {"restarted": 4, "b": 2, "a": 1}
    for cid in (keep["a running registered"], keep["b running registered"], keep["a running without agent id"]):
        assert docker_client.api.inspect_container(cid)["State"]["Running"]


def test_the_plan_shows_evidence_and_survives_serialisation(box, docker_client):
    a = make_scaler()
    cid = box.make(managed(a.name, "scaler-container-c0000001"), state="exited")
    backend = ContainerBackend(a, docker=docker_client, network_isolation=False)
    plan = backend.plan_orphans()
    assert [t.target for t in plan] == [cid]
    target = plan[0]
    assert target.kind == "container" and target.agent_id == "scaler-container-c0000001"
    assert target.evidence["state"] == "exited" and target.evidence["labels"]["kici-scaler-name"] == a.name
    assert OrphanTarget.from_dict(target.to_dict()) == target
    assert cid in box.ids(), "planning changes nothing"
    assert backend.apply_orphans([OrphanTarget.from_dict(t.to_dict()) for t in plan]) == 1
    assert cid not in box.ids()


def test_apply_rechecks_each_target_before_removing_it(box, docker_client):
    a = make_scaler()
    agent = make_agent(a, state=AgentState.SPAWNING, reserve=False)
    unregistered = box.make(managed(a.name, agent.agent_id))
    gone = box.make(managed(a.name, "scaler-container-d0000001"), state="exited")
    backend = ContainerBackend(a, docker=docker_client, network_isolation=False, tracked_ids=set)
    plan = backend.plan_orphans()
    assert {t.target for t in plan} == {unregistered, gone}
    # between plan and apply: the agent registers, and the other container is removed by someone else
    type(agent).objects.filter(pk=agent.pk).update(state=AgentState.RUNNING, registered_at=timezone.now())
    docker_client.api.remove_container(gone, force=True)
    assert backend.apply_orphans(plan) == 0
    assert unregistered in box.ids()


def test_a_blank_scaler_name_refuses_to_sweep(docker_client):
    for name in ("", "   "):
        with pytest.raises(OrphanSweepRefused, match="blank"):
            plan_container_orphans([], Owner("inst", "console", name), {}, None)
    blank = make_scaler(name=" ")
    with pytest.raises(OrphanSweepRefused):
        ContainerBackend(blank, docker=docker_client, network_isolation=False).plan_orphans()


def test_reap_unowned_removes_only_this_scalers_container_for_that_agent_id(box, docker_client):
    a, b = make_scaler(), make_scaler()
    own = box.make(managed(a.name, "scaler-container-f0000001"))
    other_scaler = box.make(managed(b.name, "scaler-container-f0000001"))
    other_agent = box.make(managed(a.name, "scaler-container-f0000002"))
    backend = ContainerBackend(a, docker=docker_client, network_isolation=False)
    assert backend.reap_unowned("scaler-container-f0000001") is True
    assert backend.reap_unowned("scaler-container-f0000001") is False
    remaining = box.ids()
    assert own not in remaining and {other_scaler, other_agent} <= remaining


@pytest.mark.parametrize("state, reclaimed", [(AgentState.FAILED, True), (AgentState.DESTROYING, False)])
def test_a_registration_refused_because_the_agent_ended_reclaims_its_container(
    box, docker_client, run_rq_jobs, state, reclaimed
):
    # The sandbox registers after its spawn was given up: a failed row has no teardown coming, so
    # its container goes; a destroying row is being torn down by someone else and is left to it.
    scaler = make_scaler()
    agent = make_agent(scaler, state=state, reserve=False)
    token = mint_registration_token(agent)
    container = box.make(managed(scaler.name, agent.agent_id))
    answer = Client().post(
        "/api/v1/agents/register", {}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert answer.status_code == 409 and answer.json()["reason"] == "not-spawning"
    run_rq_jobs()
    assert (container not in box.ids()) is reclaimed
    events = ScalerEvent.objects.filter(agent=agent, type=EventType.DESTROYED, detail__startswith="sandbox reclaimed")
    assert events.exists() is reclaimed


def test_destroy_keeps_the_containers_output_before_it_removes_it(docker_client, settings, tmp_path):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path)
    scaler = make_scaler()
    agent = make_agent(scaler, state=AgentState.DESTROYING, reserve=False)
    api = docker_client.api
    created = api.create_container(
        "kici-agent:local",
        command=["sh", "-c", "echo first; echo crash trace >&2; exec sleep 600"],
        labels={**managed(scaler.name, agent.agent_id), TEST_LABEL: "archive"},
        host_config=api.create_host_config(network_mode="none", init=True),
    )
    try:
        api.start(created["Id"])
        for _ in range(50):  # both lines written before the teardown
            if b"crash trace" in api.logs(created["Id"], stdout=True, stderr=True):
                break
            time.sleep(0.1)
        agent.managed_id = created["Id"]
        ContainerBackend(scaler, docker=docker_client, network_isolation=False).destroy(agent)
        assert api.containers(all=True, filters={"id": created["Id"]}) == []
        assert sorted(archived_lines(agent.agent_id).lines) == ["crash trace", "first"]
    finally:
        with contextlib.suppress(Exception):
            api.remove_container(created["Id"], force=True)


def test_reap_unowned_answers_false_when_the_runtime_cannot_be_listed(settings):
    import docker

    a = make_scaler()
    dead = docker.DockerClient(base_url="unix:///run/ctr-no-such-docker.sock", version="1.41", timeout=2)
    assert ContainerBackend(a, docker=dead, network_isolation=False).reap_unowned("scaler-container-f0000003") is False


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, "ctr_kici_orph")


def test_rules_are_reaped_only_for_addresses_no_kici_container_holds(box, docker_client, nft_table):
    from network.nft.spec import AgentSpec

    a, b = make_scaler(), make_scaler()
    neighbour = box.make(managed(b.name, "scaler-container-90000001"))
    held = docker_client.api.inspect_container(neighbour)["NetworkSettings"]["Networks"][ISOLATED_NETWORK_NAME][
        "IPAddress"
    ]
    for address in ("172.30.250.9", held, "10.0.0.7"):
        nft_table.apply_agent(AgentSpec.build(address, "172.30.0.1", host_access=["*:8000"]))
    backend = ContainerBackend(a, docker=docker_client, nft=nft_table)
    plan = backend.plan_orphans()
    assert [(t.kind, t.target) for t in plan] == [("rule", "172.30.250.9")]
    assert backend.apply_orphans(plan) == 1
    left = {str(x) for x in nft_table.list_agents()}
    assert left == {held, "10.0.0.7"}, "the neighbour's rules and addresses outside 172.30/16 stay"
    # once the neighbour is gone its rules are stale
    docker_client.api.remove_container(neighbour, force=True)
    assert backend.reap_unowned_isolation_rules() == 1
    assert {str(x) for x in nft_table.list_agents()} == {"10.0.0.7"}


def test_no_rule_is_reaped_when_the_runtime_cannot_be_listed(nft_table):
    import docker

    from network.nft.spec import AgentSpec

    nft_table.apply_agent(AgentSpec.build("172.30.250.10", "172.30.0.1", host_access=[]))
    dead = docker.DockerClient(base_url="unix:///run/ctr-no-such-docker.sock", version="1.41", timeout=2)
    backend = ContainerBackend(make_scaler(), docker=dead, nft=nft_table)
    assert backend.reap_unowned_isolation_rules() == 0
    assert backend.plan_rule_orphans() == []
    assert {str(x) for x in nft_table.list_agents()} == {"172.30.250.10"}


def test_a_console_on_a_restored_copy_of_the_database_and_the_first_never_plan_each_others_agents(
    box, docker_client, agent_image, settings
):
    # Two consoles on one docker host, the second started on a restored copy of the first's
    # database: the same installation id and scaler name, another instance. Each knows only its own
    # agents (the copy never heard of those A spawned after it was made, nor A of B's).
    scaler = make_scaler()
    containers: dict[str, dict[str, str]] = {"console-a": {}, "console-b": {}}
    known: dict[str, set[str]] = {"console-a": set(), "console-b": set()}
    for console in containers:
        settings.KICI_INSTANCE_ID = console
        backend = ContainerBackend(scaler, docker=docker_client, network_isolation=False)
        for role, state in (("running 1", "running"), ("running 2", "running"), ("orphan", "exited")):
            agent = make_agent(scaler, state=AgentState.RUNNING, registered_at=timezone.now(), reserve=False)
            labels = backend.create_config(agent, None, agent_image)["labels"]  # what a spawn stamps
            assert labels["kici-instance-id"] == console and labels["kici-scaler-name"] == scaler.name
            containers[console][role] = box.make(labels, state=state)
            if role != "orphan":
                known[console].add(agent.agent_id)
    legacy = box.make(managed(None, "scaler-container-e00000aa") | {"kici-scaler-name": scaler.name}, "exited")

    def console(name: str) -> ContainerBackend:
        settings.KICI_INSTANCE_ID = name
        ids = known[name]
        return ContainerBackend(
            scaler,
            docker=docker_client,
            network_isolation=False,
            tracked_ids=lambda: ids,
            is_registered=ids.__contains__,
        )

    for me, other in (("console-a", "console-b"), ("console-b", "console-a")):
        plan = console(me).plan_containers()
        assert [t.target for t in plan.targets] == [containers[me]["orphan"]], me
        spared = {s.container_id: s.reason for s in plan.spared}
        for cid in containers[other].values():
            assert spared[cid] == f"skipped: another console's (kici-instance-id={other})", (me, cid)
        assert spared[legacy] == "skipped: ownership unknown (no kici-installation-id, kici-instance-id)"

    for me, other in (("console-a", "console-b"), ("console-b", "console-a")):
        backend = console(me)
        assert backend.cleanup_orphans() == 1
        # a registration refused for an agent id of `me`'s: only `me` reclaims its container
        victim = box.make(managed(scaler.name, "scaler-container-e00000bb"))  # stamped with `me`'s labels
        assert console(other).reap_unowned("scaler-container-e00000bb") is False
        assert victim in box.ids()
        assert console(me).reap_unowned("scaler-container-e00000bb") is True
    remaining = box.ids()
    assert legacy in remaining
    for name in containers:
        assert containers[name]["orphan"] not in remaining
        for role in ("running 1", "running 2"):
            assert docker_client.api.inspect_container(containers[name][role])["State"]["Running"], (name, role)
