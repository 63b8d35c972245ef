"""What a container spawn checks before its create is checked once for every spawn of the host
(each spawn runs in a work-horse of its own), and checked again when it is proven stale: the
guard when the nft tables were made again or its record expired, the agent network when the
runtime no longer has the network the record names. An image is never remembered: each create
resolves its tag again."""

from __future__ import annotations

import secrets
import time

import pytest

from scalers.backends.container import ready
from scalers.backends.container.backend import ContainerBackend
from scalers.backends.container.ready import AgentNetwork, agent_network, forget_spawn_facts
from scalers.backends.container.rules import ContainerRuleWriter
from scalers.backends.container.spawn import Attachment, create_with_pull
from scalers.backends.docker_net import ISOLATED_NETWORK_NAME, ensure_isolated_network, network_bridge_name
from tests.support.containers import remove_test_containers
from tests.support.network_lab import Netns
from tests.support.root import require_root
from tests.support.scalers import make_agent, make_scaler


@pytest.fixture(autouse=True)
def own_host(settings):
    """Facts of a host of this test's own, forgotten afterwards."""
    settings.KICI_HOST_NAME = f"facts-{secrets.token_hex(3)}"
    yield
    forget_spawn_facts()


class FakeNft:
    def __init__(self, handles: str = "inet:1,bridge:2,netdev:3"):
        self.table, self.netns, self.handles, self.trusted = "kici", None, handles, False

    def table_handles(self) -> str:
        return self.handles

    def trust_base(self) -> None:
        self.trusted = True


class FakeIsolation:
    """The isolation of one work-horse: counts the guards it writes."""

    def __init__(self, nft: FakeNft):
        self.client, self.checks = nft, []

    def check(self, bridge: str) -> None:
        self.checks.append(bridge)


def work_horse(nft: FakeNft) -> tuple[ContainerRuleWriter, FakeIsolation]:
    isolation = FakeIsolation(nft)
    return ContainerRuleWriter(lambda: isolation, lambda: [], True), isolation  # type: ignore[arg-type,return-value]


def test_the_guard_is_written_by_the_first_spawn_of_the_host_and_taken_as_written_by_the_next():
    nft = FakeNft()
    first, first_isolation = work_horse(nft)
    first.ensure_guard("br-a")
    second, second_isolation = work_horse(nft)
    second.ensure_guard("br-a")
    assert first_isolation.checks == ["br-a"] and second_isolation.checks == []
    assert nft.trusted  # the second's client skips the base when it writes its agent
    third, third_isolation = work_horse(nft)
    third.ensure_guard("br-b")  # another bridge: its own guard
    assert third_isolation.checks == ["br-b"]


def test_the_guard_is_written_again_when_the_tables_were_made_again_or_its_record_expired(monkeypatch):
    nft = FakeNft()
    work_horse(nft)[0].ensure_guard("br-a")
    nft.handles = "inet:7,bridge:8,netdev:9"  # deleted and made again: new handles
    writer, isolation = work_horse(nft)
    writer.ensure_guard("br-a")
    assert isolation.checks == ["br-a"]
    nft.handles = ""  # one of the tables is missing
    writer, isolation = work_horse(nft)
    writer.ensure_guard("br-a")
    assert isolation.checks == ["br-a"]
    nft.handles = "inet:10,bridge:11,netdev:12"
    monkeypatch.setattr("scalers.backends.container.rules.GUARD_CHECK_SECONDS", 0.2)
    work_horse(nft)[0].ensure_guard("br-a")
    time.sleep(0.3)
    writer, isolation = work_horse(nft)
    writer.ensure_guard("br-a")
    assert isolation.checks == ["br-a"]
    writer, isolation = work_horse(nft)
    writer.ensure_guard("br-a", write=True)  # the sweeper's host check writes whatever the record says
    assert isolation.checks == ["br-a"]


@pytest.mark.root
def test_the_tables_read_otherwise_once_deleted_and_made_again():
    require_root()
    from network.nft.apply import NftClient

    ns = Netns(f"kfacts{secrets.token_hex(3)}")
    try:
        nft = NftClient(f"facts{secrets.token_hex(2)}", netns=ns.name)
        assert nft.table_handles() == ""
        nft.ensure_table()
        before = nft.table_handles()
        assert before.count(":") == 3 and nft.table_handles() == before
        nft.delete_table()
        assert nft.table_handles() == ""
        nft.ensure_table()
        assert nft.table_handles() not in ("", before)
    finally:
        ns.delete()


class Guards:
    """A rule writer with isolation on that records the bridges it was asked to guard."""

    enabled = True

    def __init__(self):
        self.bridges: list[str] = []

    def ensure_guard(self, bridge: str, *, write: bool = False) -> None:
        self.bridges.append(bridge)


@pytest.mark.docker
@pytest.mark.django_db
def test_a_spawn_whose_record_names_a_network_gone_since_finds_the_network_again(docker_client, agent_image):
    """The record names a network the runtime no longer has (removed, or removed and made again
    under the same name): the create is refused instead of attaching elsewhere, and the spawn
    finds the network, guards its bridge, records it and creates on it."""
    net_id = ensure_isolated_network(docker_client)
    bridge = network_bridge_name(docker_client, net_id)
    host = ContainerBackend(make_scaler(), docker=docker_client).host
    runtime_key = str(docker_client.api.base_url)
    gone = secrets.token_hex(32)
    ready._remember(ready._network_key(runtime_key), f'{{"id": "{gone}", "bridge": "br-{gone[:12]}"}}')
    guards = Guards()
    attachment = Attachment(host, guards, True)  # type: ignore[arg-type]
    assert attachment.attach() == f"br-{gone[:12]}"
    scaler = make_scaler()
    backend = ContainerBackend(scaler, docker=docker_client)
    agent = make_agent(scaler)
    attempts: list[str] = []

    def create() -> str:
        attempts.append(attachment.network.id)
        config = backend.create_config(agent, None, agent_image, **attachment.config_options())
        return create_with_pull(docker_client.api, agent, config, agent_image, "Never")["Id"]

    try:
        container_id, on = attachment.create_and_start(create, docker_client.api.start)
        info = docker_client.api.inspect_container(container_id)
        left = docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})
    finally:
        remove_test_containers(docker_client)
    assert attempts == [gone, net_id]
    assert [c["Id"] for c in left] == [container_id]  # the one refused its network was removed
    assert (on, guards.bridges) == (bridge, [f"br-{gone[:12]}", bridge])
    assert not info["State"]["StartedAt"].startswith("0001-")
    assert list(info["NetworkSettings"]["Networks"]) == [ISOLATED_NETWORK_NAME]
    assert info["NetworkSettings"]["Networks"][ISOLATED_NETWORK_NAME]["NetworkID"] == net_id
    assert agent_network(docker_client, runtime_key, local=True) == AgentNetwork(net_id, bridge)


@pytest.mark.docker
def test_each_create_resolves_the_image_tag_again(docker_client, agent_image):
    """An image re-pulled (or built again) under the same tag is what the next spawn runs: the
    create names the image by its tag, and nothing remembers the id it resolved to."""
    api = docker_client.api
    tag = f"kici-facts-{secrets.token_hex(3)}:1"
    containers = [api.create_container(agent_image, command=["true"])["Id"]]
    other = api.commit(containers[0], message="a new image of the same tag")["Id"]
    created = []
    try:
        for image_id in (api.inspect_image(agent_image)["Id"], other):
            repo, version = tag.split(":")
            api.tag(image_id, repo, version, force=True)
            containers.append(create_with_pull(api, None, {"image": tag, "command": ["true"]}, tag, "Never")["Id"])
            created.append(api.inspect_container(containers[-1])["Image"])
    finally:
        for container_id in containers:
            api.remove_container(container_id, force=True)
        api.remove_image(tag, force=True)  # the last name of the committed image: it goes too
    assert created == [api.inspect_image(agent_image)["Id"], other]
