"""Isolation on a production-shaped docker host, proven with real packets from real agents.

The daemon (``tests/support/prod_docker.py``) runs in a network namespace with no uplink and
manages its own iptables and ip6tables there. The console's nft and netlink calls run in that
namespace (``settings.KICI_NFT_NETNS``), as in production they run where docker runs. Agents are
spawned by the rq job (``scalers.jobs.spawn_agent``) through the container backend; only their
command is replaced (a sleep, or a connection loop). Probes are sent from inside each container's
network namespace, with IPv6 turned back on in it (the backend turns it off), so what stops an
IPv6 packet is the nft wall, not the sysctl one.

Inside docker's namespace (all of it made by the test or by docker there)::

    agent containers ──┐
    stranger ns ─veth──┤ br-<id> (kici-agent-net: 172.30.0.1/16, fe80::…)
                          lo: 10.99.0.1, 169.254.1.1 (the host's own, test owned)
                          kps-lan0 10.214.0.1/24 ──veth── neighbour ns: kps-lan1 10.214.0.2/24,
                                                          lo 203.0.113.7 (stand-in for the
                                                          internet), 169.254.169.254
"""

from __future__ import annotations

import secrets
import socket
import time
from dataclasses import dataclass, field

import pytest

from agents.models import Agent
from network import netlink
from network.nft.apply import NftClient
from network.nft.names import AGENT_MAC_PREFIX, BRIDGE_FAMILY, PORT_SETS
from network.nft.spec import AgentSpec
from operations.kinds.reaping import backend_for
from scalers.backends.container.backend import ContainerBackend
from scalers.backends.container.ready import forget_spawn_facts
from scalers.backends.docker_net import (
    ISOLATED_NETWORK_GATEWAY,
    ISOLATED_NETWORK_NAME,
    ensure_isolated_network,
    forget_isolated_network,
    network_bridge_name,
)
from scalers.jobs import spawn_agent
from tests.support import prod_docker
from tests.support.containers import remove_test_containers
from tests.support.frames import (
    ETH_P_ARP,
    ETH_P_IP,
    TAGS,
    Sniffer,
    arp_reply,
    build_rawframe,
    copy_rawframe,
    ethernet,
    ipv4_udp,
    rawframe_in,
)
from tests.support.network_lab import CountingListener, Listener, Netns, Target, both, reachability, run
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

GW = ISOLATED_NETWORK_GATEWAY
TABLE, TABLE_B = "prod_kici", "prod_kici_b"
ALLOWED, FORBIDDEN = 4000, 4001
COUNTED = 4102  # a UDP port that counts what arrives
AGENT_PORT = 7000
OWN_PRIVATE, OWN_LINK_LOCAL = "10.99.0.1", "169.254.1.1"
NEIGHBOUR, METADATA, PUBLIC = "10.214.0.2", "169.254.169.254", "203.0.113.7"
SLEEP = ["/bin/sleep", "3600"]
PROBE_TIMEOUT = 1.0


@dataclass
class World:
    """Docker's namespace (``ns``) with its test-owned addresses and listeners, the neighbour
    namespace, the agent bridge and a client of the daemon."""

    ns: Netns
    lan: Netns
    bridge: str
    client: object
    listeners: list = field(default_factory=list)

    def bridge_mac(self) -> str:
        out = self.ns.ip("-o", "link", "show", "dev", self.bridge).stdout.split()
        return out[out.index("link/ether") + 1]

    def gateway_link_local(self) -> str:
        """The bridge's IPv6 link-local address (it has one once a port is up)."""
        deadline = time.monotonic() + 5
        while True:
            out = self.ns.ip("-6", "-o", "addr", "show", "dev", self.bridge, "scope", "link").stdout.split()
            if (out and "tentative" not in out) or time.monotonic() > deadline:
                assert out, f"bridge {self.bridge} has no link-local address"
                return out[3].split("/")[0]
            time.sleep(0.1)


@pytest.fixture(scope="module")
def world(prod_dockerd):
    ns = prod_dockerd
    client = prod_docker.docker_client()
    bridge = network_bridge_name(client, ensure_isolated_network(client))
    lan = Netns(f"kps-{secrets.token_hex(2)}-lan")
    w = World(ns=ns, lan=lan, bridge=bridge, client=client)
    try:
        ns.ip("addr", "add", f"{OWN_PRIVATE}/32", "dev", "lo")
        ns.ip("addr", "add", f"{OWN_LINK_LOCAL}/32", "dev", "lo")
        ns.ip("link", "add", "kps-lan0", "type", "veth", "peer", "name", "kps-lan1", "netns", lan.name)
        ns.ip("addr", "add", "10.214.0.1/24", "dev", "kps-lan0")
        ns.ip("link", "set", "kps-lan0", "up")
        ns.ip("route", "add", "203.0.113.0/24", "via", NEIGHBOUR)
        ns.ip("route", "add", f"{METADATA}/32", "via", NEIGHBOUR)
        lan.ip("addr", "add", f"{NEIGHBOUR}/24", "dev", "kps-lan1")
        lan.ip("link", "set", "kps-lan1", "up")
        lan.ip("addr", "add", f"{PUBLIC}/32", "dev", "lo")
        lan.ip("addr", "add", f"{METADATA}/32", "dev", "lo")
        lan.ip("route", "add", "default", "via", "10.214.0.1")
        # UDP listeners on each address, so that an answer comes from the address asked (the
        # outside is reached through docker's masquerade, which maps only that flow back).
        for port in (ALLOWED, FORBIDDEN):
            w.listeners += [Listener(ns, port, "tcp", "0.0.0.0"), Listener(ns, port, "tcp", "::")]
            w.listeners += [Listener(ns, port, "udp", a) for a in (GW, OWN_PRIVATE, OWN_LINK_LOCAL, "::")]
        w.listeners.append(Listener(lan, 80, "tcp", "0.0.0.0"))
        w.listeners += [Listener(lan, 80, "udp", a) for a in (NEIGHBOUR, PUBLIC, METADATA)]
        yield w
    finally:
        for listener in w.listeners:
            listener.close()
        lan.delete()
        for address in (OWN_PRIVATE, OWN_LINK_LOCAL):
            ns.ip("addr", "del", f"{address}/32", "dev", "lo", check=False)
        client.close()


class ContainerNetns(Netns):
    """A running container's network namespace, named (``ip netns attach``) so that probes and
    listeners open their sockets in it; :meth:`delete` removes the name only."""

    def __init__(self, name: str, pid: int):
        self.name = name
        run(["ip", "netns", "attach", name, str(pid)])


@dataclass
class Box:
    """One spawned agent: its row, its container's namespace, its bridge port and (once IPv6 is
    turned back on inside) its link-local address."""

    agent: Agent
    ns: ContainerNetns
    mac: str
    link_local: str = ""

    @property
    def ip(self) -> str:
        return self.agent.ip

    @property
    def port(self) -> str:
        return self.agent.bridge_port


def run_command(monkeypatch, command: list[str]) -> None:
    """Agent containers run ``command`` instead of the agent script; everything else is the backend's."""
    real = ContainerBackend.create_config

    def create_config(self, agent, token, image, runtime_volume=None, network_id=""):
        return {**real(self, agent, token, image, runtime_volume, network_id), "command": command}

    monkeypatch.setattr(ContainerBackend, "create_config", create_config)


def entry(*host_access: str) -> dict:
    """A label-set entry on the agent image with an explicit host access."""
    return {"image": "kici-agent:local", "imagePullPolicy": "Never", "networkPolicy": {"hostAccess": list(host_access)}}


class Console:
    """The test's console on the production-shaped host: spawns agents the real way, makes
    strangers on the bridge, and removes everything it made."""

    def __init__(self, world: World):
        self.world = world
        self.nft = NftClient(TABLE, netns=prod_docker.NETNS)
        self.names: list[Netns] = []
        self.links: list[str] = []

    def spawn(self, scaler) -> Box:
        agent = make_agent(scaler)
        assert spawn_agent(agent.pk) == "spawned", Agent.objects.get(pk=agent.pk).failure_reason
        agent.refresh_from_db()
        assert agent.ip and agent.bridge_port, (agent.ip, agent.bridge_port)
        info = self.world.client.api.inspect_container(agent.managed_id)
        ns = ContainerNetns(f"kps-{agent.agent_id[-8:]}", info["State"]["Pid"])
        self.names.append(ns)
        return Box(agent, ns, info["NetworkSettings"]["Networks"][ISOLATED_NETWORK_NAME]["MacAddress"])

    def with_ipv6(self, box: Box) -> Box:
        """Turn IPv6 back on inside the container (no duplicate address detection, so its
        link-local address is usable at once) and listen on :data:`AGENT_PORT` over both families."""
        keys = ("all", "default", "eth0")
        box.ns.exec("sysctl", "-qw", *[f"net.ipv6.conf.{k}.accept_dad=0" for k in keys])
        box.ns.exec("sysctl", "-qw", *[f"net.ipv6.conf.{k}.disable_ipv6=0" for k in keys])
        deadline = time.monotonic() + 5
        while not box.link_local and time.monotonic() < deadline:
            out = box.ns.ip("-6", "-o", "addr", "show", "dev", "eth0", "scope", "link").stdout.split()
            if out and "tentative" not in out:
                box.link_local = out[3].split("/")[0]
            time.sleep(0.05)
        assert box.link_local, "no IPv6 link-local address inside the container"
        return box

    def listen(self, box: Box) -> None:
        families = ["0.0.0.0"] + (["::"] if box.link_local else [])
        self.world.listeners += [Listener(box.ns, AGENT_PORT, p, bind) for p in ("tcp", "udp") for bind in families]

    def stranger(self, address: str) -> Netns:
        """A namespace of the test's own on docker's bridge (a veth enslaved as docker enslaves
        a container's), holding ``address`` on 172.30.0.0/16, default route via the gateway."""
        tag = secrets.token_hex(2)
        ns = Netns(f"kps-{tag}-st")
        self.names.append(ns)
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0")
        link = f"kps-s{tag}"
        self.world.ns.ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        self.links.append(link)
        netlink.enslave(link, self.world.bridge, isolated=False, netns=prod_docker.NETNS)
        ns.ip("addr", "add", f"{address}/16", "dev", "eth0", "nodad")
        ns.ip("link", "set", "eth0", "up")
        ns.ip("route", "add", "default", "via", GW)
        ns.port = link  # type: ignore[attr-defined]
        ns.mac = ns.exec("cat", "/sys/class/net/eth0/address").stdout.strip()  # type: ignore[attr-defined]
        return ns

    def bind_link_local(self, box: Box, bound: bool = True) -> None:
        """Add (or delete) the (port, MAC, link-local) binding of ``box`` to the bridge table's IPv6
        binding set, as if it were an IPv6-keyed agent: a control showing what the guard alone decides."""
        elem = {"family": BRIDGE_FAMILY, "table": TABLE, "name": PORT_SETS[6], "elem": [
            {"concat": [box.port, box.mac, box.link_local]}]}  # fmt: skip
        self.nft.apply_document([{"add" if bound else "delete": {"element": elem}}])

    def close(self) -> None:
        for ns in self.names:
            ns.delete()
        for link in self.links:
            self.world.ns.ip("link", "del", link, check=False)
        remove_test_containers(self.world.client)
        for table in (TABLE, TABLE_B):
            NftClient(table, netns=prod_docker.NETNS).delete_table()


@pytest.fixture
def console(world, settings, monkeypatch):
    """Spawns go to the namespaced daemon; the backend's nft and netlink calls run in its
    namespace (``operations.kinds.reaping.backend_for``: an ``NftClient`` there, for the scaler's
    table); agent containers sleep."""
    settings.DOCKER_HOST = prod_docker.DOCKER_HOST
    settings.KICI_NFT_NETNS = prod_docker.NETNS
    settings.KICI_NFT_TABLE = TABLE
    monkeypatch.setattr("scalers.jobs.get_backend", lambda scaler, **options: backend_for(scaler))
    run_command(monkeypatch, SLEEP)
    forget_isolated_network()
    forget_spawn_facts()
    c = Console(world)
    yield c
    c.close()
    forget_isolated_network()
    forget_spawn_facts()


@pytest.fixture(params=["0", "1"], ids=["br_netfilter-off", "br_netfilter-on"])
def br_netfilter(request, world):
    """``bridge-nf-call-iptables`` / ``-ip6tables`` in docker's namespace: bridged frames pass
    through the inet hooks and docker's own iptables (1) or not (0)."""
    keys = ("net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables")
    before = [world.ns.exec("sysctl", "-n", k).stdout.strip() for k in keys]
    for k in keys:
        world.ns.sysctl(k, request.param)
    yield request.param
    for k, v in zip(keys, before, strict=True):
        world.ns.sysctl(k, v)


def probe(ns: Netns, targets: list[Target]) -> dict[str, bool]:
    return reachability(ns, targets, timeout=PROBE_TIMEOUT)


def assert_all(results: dict[str, bool], expected: bool) -> None:
    wrong = [t for t, ok in results.items() if ok is not expected]
    assert not wrong, f"expected {'open' if expected else 'closed'}: {wrong}"


def scoped(address: str) -> str:
    return f"{address}%eth0"


def send_datagrams(ns: Netns, host: str, port: int, count: int = 5) -> None:
    """``count`` UDP datagrams from ``ns`` to host:port, then a moment for them to arrive."""
    sock = ns.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(count):
            sock.sendto(b"x", (host, port))
            time.sleep(0.05)
    finally:
        sock.close()
    time.sleep(0.3)


# -- the matrix ---------------------------------------------------------------------------------


def test_an_agent_reaches_its_host_port_and_the_outside_only_over_ipv4_and_ipv6_link_local(
    console, world, br_netfilter
):
    """Each of two agents reaches the allowed host port and the routed outside; not another host
    port, not the host's own RFC1918 and link-local addresses, not the neighbour or the metadata
    address, not the other agent, and nothing over IPv6 link-local (the bridge's or the other
    agent's), although IPv6 is back on inside the containers."""
    scaler = make_scaler(ls_config=entry(f"{GW}:{ALLOWED}"))
    a, b = (console.with_ipv6(console.spawn(scaler)) for _ in range(2))
    for box in (a, b):
        assert box.mac.startswith(AGENT_MAC_PREFIX + ":"), f"the container's MAC {box.mac} is not an agent MAC"
        console.listen(box)
    gw6 = world.gateway_link_local()
    for me, peer in ((a, b), (b, a)):
        assert_all(probe(me.ns, both(GW, ALLOWED) + both(PUBLIC, 80)), True)
        closed = (
            both(GW, FORBIDDEN) + both(OWN_PRIVATE, ALLOWED, FORBIDDEN) + both(OWN_LINK_LOCAL, ALLOWED)
            + both(NEIGHBOUR, 80) + both(METADATA, 80) + both(peer.ip, AGENT_PORT)
            + both(scoped(gw6), ALLOWED, FORBIDDEN) + both(scoped(peer.link_local), AGENT_PORT)
        )  # fmt: skip
        assert_all(probe(me.ns, closed), False)

    # Control: with their link-local pairs bound as an IPv6 agent's would be, the same IPv6
    # probes reach the host (so the guard closed them above) and the host reaches b; agent to
    # agent stays closed, because agent MACs are never bridged port to port.
    for box in (a, b):
        console.bind_link_local(box)
    assert_all(probe(a.ns, both(scoped(gw6), ALLOWED)), True)
    assert_all(probe(world.ns, both(f"{b.link_local}%{world.bridge}", AGENT_PORT)), True)
    assert_all(probe(a.ns, both(scoped(b.link_local), AGENT_PORT)), False)


def test_an_unknown_source_on_the_bridge_reaches_nothing(console, world, br_netfilter):
    """A veth of the test's own on docker's bridge, with an address no agent has, beside a bound
    agent: nothing on the host, beyond it, or on the other agent answers it, over IPv4 or IPv6
    link-local. Bound like an agent, the same source reaches its entry (the control)."""
    box = console.with_ipv6(console.spawn(make_scaler(ls_config=entry(f"{GW}:{ALLOWED}"))))
    console.listen(box)
    stranger = console.stranger("172.30.250.9")
    gw6 = world.gateway_link_local()
    targets = (
        both(GW, ALLOWED, FORBIDDEN) + both(OWN_PRIVATE, ALLOWED) + both(PUBLIC, 80) + both(NEIGHBOUR, 80)
        + both(box.ip, AGENT_PORT) + both(scoped(gw6), ALLOWED) + both(scoped(box.link_local), AGENT_PORT)
    )  # fmt: skip
    assert_all(probe(stranger, targets), False)
    assert_all(probe(box.ns, both(GW, ALLOWED)), True)

    bound = AgentSpec.build("172.30.250.9", GW, host_access=[f"{GW}:{ALLOWED}"], port=stranger.port, mac=stranger.mac)
    console.nft.apply_agent(bound)
    stranger.ip("neigh", "flush", "dev", "eth0")  # its ARP for the gateway failed until now: ask again
    assert_all(probe(stranger, both(GW, ALLOWED) + both(PUBLIC, 80)), True)


def test_a_spoofed_source_reaches_nothing(console, world, br_netfilter):
    """The same stranger claiming a live agent's address: that agent reaches its entry from its
    own port; the spoofer, from another port, reaches nothing, not even one way (it knows the
    gateway's MAC without asking), and takes nothing from the agent (ARP included: the inet
    guard sees only IPv4 and IPv6)."""
    box = console.spawn(make_scaler(ls_config=entry(f"{GW}:{ALLOWED}", f"{GW}:{COUNTED}")))
    counted = CountingListener(world.ns, COUNTED, "udp")
    try:
        spoofer = console.stranger(box.ip)
        spoofer.ip("neigh", "replace", GW, "lladdr", world.bridge_mac(), "dev", "eth0", "nud", "permanent")
        assert_all(probe(box.ns, both(GW, ALLOWED)), True)
        send_datagrams(spoofer, GW, COUNTED)
        assert counted.count == 0, f"{counted.count} datagrams from the spoofer arrived"
        send_datagrams(box.ns, GW, COUNTED)
        assert counted.count > 0  # control: the agent's own arrive
    finally:
        counted.close()
    assert_all(probe(spoofer, both(GW, ALLOWED, FORBIDDEN) + both(PUBLIC, 80) + both(OWN_PRIVATE, ALLOWED)), False)
    # Its ARP did not teach the host its MAC for the agent's address: the agent still gets its replies.
    neighbour = world.ns.ip("neigh", "show", box.ip, "dev", world.bridge).stdout.split()
    assert "lladdr" not in neighbour or neighbour[neighbour.index("lladdr") + 1] == box.mac, neighbour
    assert_all(probe(box.ns, both(GW, ALLOWED)), True)


def test_replies_to_connections_the_host_opens_pass(console, world, br_netfilter):
    """An agent with an empty host access opens nothing on the host, but answers it."""
    box = console.spawn(make_scaler(ls_config=entry()))
    console.listen(box)
    assert_all(probe(world.ns, both(box.ip, AGENT_PORT)), True)
    assert_all(probe(box.ns, both(GW, ALLOWED, FORBIDDEN)), False)


# -- the start-up gap ---------------------------------------------------------------------------


def test_an_agent_whose_first_act_is_a_forbidden_connection_never_makes_one(console, world, monkeypatch):
    """The container connects to a forbidden host port from its first instant, then to its
    allowed one, in a loop: the guard drops its frames until its rules are bound, so the
    forbidden port never sees a connection and the allowed one does."""
    forbidden, allowed = CountingListener(world.ns, 4100), CountingListener(world.ns, 4101)
    loop = f"while :; do nc -w 1 {GW} 4100 </dev/null; nc -w 1 {GW} 4101 </dev/null; done"
    run_command(monkeypatch, ["/bin/sh", "-c", loop])
    try:
        console.spawn(make_scaler(ls_config=entry(f"{GW}:4101")))
        deadline = time.monotonic() + 20
        while allowed.count < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert allowed.count >= 3, f"the allowed port saw {allowed.count} connections"
        assert forbidden.count == 0, f"the forbidden port saw {forbidden.count} connections"
    finally:
        forbidden.close()
        allowed.close()


# -- two consoles -------------------------------------------------------------------------------


def test_two_consoles_on_one_docker_host_each_keep_exactly_their_own_policy(console, world):
    """Two consoles (two tables) spawn onto the same docker network and bridge: each table holds
    only its own agent, each agent reaches exactly its own entry and not the other agent, and a
    stranger passes neither guard."""
    a = console.spawn(make_scaler(ls_config=entry(f"{GW}:{ALLOWED}")))
    b = console.spawn(make_scaler(ls_config=entry(f"{GW}:{FORBIDDEN}"), config={"nftTable": TABLE_B}))
    for box in (a, b):
        console.listen(box)
    nft_b = NftClient(TABLE_B, netns=prod_docker.NETNS)
    for nft, box in ((console.nft, a), (nft_b, b)):
        assert {str(addr): rules.ports for addr, rules in nft.list_agents().items()} == {box.ip: [box.port]}
    assert_all(probe(a.ns, both(GW, ALLOWED)), True)
    assert_all(probe(a.ns, both(GW, FORBIDDEN) + both(b.ip, AGENT_PORT)), False)
    assert_all(probe(b.ns, both(GW, FORBIDDEN)), True)
    assert_all(probe(b.ns, both(GW, ALLOWED) + both(a.ip, AGENT_PORT)), False)
    assert_all(probe(world.ns, both(a.ip, AGENT_PORT) + both(b.ip, AGENT_PORT)), True)  # both answer the host
    stranger = console.stranger("172.30.250.10")
    assert_all(probe(stranger, both(GW, ALLOWED, FORBIDDEN) + both(PUBLIC, 80)), False)


# -- layer 2: raw frames from inside an agent container -------------------------------------------


@pytest.fixture(scope="module")
def rawframe(tmp_path_factory):
    """The static raw-frame helper (``tests/support/rawframe.c``), built once."""
    return build_rawframe(tmp_path_factory.mktemp("rawframe"))


def test_an_agent_container_has_no_cap_net_raw_unless_its_label_set_says_net_raw(console, world, rawframe):
    """The backend's HostConfig drops NET_RAW: a packet socket is refused inside the container,
    as it would be to a job step. ``netRaw: true`` gives it back."""
    plain = console.spawn(make_scaler(ls_config=entry(f"{GW}:{ALLOWED}")))
    raw = console.spawn(make_scaler(ls_config={**entry(f"{GW}:{ALLOWED}"), "netRaw": True}))
    api = world.client.api
    caps = [api.inspect_container(box.agent.managed_id)["HostConfig"].get("CapDrop") for box in (plain, raw)]
    assert caps == [["NET_RAW"], None]
    for box in (plain, raw):
        copy_rawframe(api, box.agent.managed_id, rawframe)
    refused = rawframe_in(api, plain.agent.managed_id, [])
    assert refused == (77, "socket: Operation not permitted\n")
    assert rawframe_in(api, raw.agent.managed_id, []) == (0, "sent 0 frames\n")


def _neighbour(ns: Netns, address: str, dev: str) -> str | None:
    out = ns.ip("neigh", "show", address, "dev", dev).stdout.split()
    return out[out.index("lladdr") + 1] if "lladdr" in out else None


def test_raw_frames_from_an_agent_container_poison_and_reach_nothing(console, world, rawframe):
    """An agent with CAP_NET_RAW (``netRaw: true``) sends, behind no tag, one tag, 802.1ad + 802.1Q,
    two 802.1Q tags and a 0x9100 tag: ARP replies claiming the gateway (to its neighbour) and the
    neighbour (to the host), and UDP forged from the gateway to the neighbour's socket. Neither
    neighbour table changes and the socket gets nothing, while a sniffer on the sender's bridge
    port sees every frame leave the container (the control)."""
    scaler = make_scaler(ls_config={**entry(f"{GW}:{ALLOWED}"), "netRaw": True})
    attacker, victim = console.spawn(scaler), console.spawn(scaler)
    api = world.client.api
    copy_rawframe(api, attacker.agent.managed_id, rawframe)
    gw_mac = world.bridge_mac()
    victim.ns.exec("sysctl", "-qw", "net.ipv4.neigh.eth0.locktime=0")
    locktime = f"net.ipv4.neigh.{world.bridge}.locktime"
    before = world.ns.exec("sysctl", "-n", locktime).stdout.strip()
    world.ns.sysctl(locktime, "0")
    victim.ns.ip("neigh", "replace", GW, "lladdr", gw_mac, "dev", "eth0", "nud", "stale")
    world.ns.ip("neigh", "replace", victim.ip, "lladdr", victim.mac, "dev", world.bridge, "nud", "stale")
    marker = b"l2-" + secrets.token_hex(6).encode()
    frames = []
    for tags in TAGS.values():
        frames += [
            ethernet(victim.mac, attacker.mac, ETH_P_ARP, arp_reply(attacker.mac, GW, victim.mac, victim.ip), tags),
            ethernet(gw_mac, attacker.mac, ETH_P_ARP, arp_reply(attacker.mac, victim.ip, gw_mac, GW), tags),
            ethernet(victim.mac, attacker.mac, ETH_P_IP, ipv4_udp(GW, victim.ip, 53, 7100, marker), tags),
        ]
    inbox = victim.ns.socket(socket.AF_INET, socket.SOCK_DGRAM)
    inbox.bind(("0.0.0.0", 7100))
    inbox.settimeout(0.8)
    port_sniffer = Sniffer(world.ns.name, attacker.port)
    try:
        assert rawframe_in(api, attacker.agent.managed_id, frames)[0] == 0
        assert port_sniffer.saw(marker), "the control: the frames left the container"
        time.sleep(0.3)
        assert _neighbour(victim.ns, GW, "eth0") == gw_mac, "the neighbour's gateway entry was poisoned"
        assert _neighbour(world.ns, victim.ip, world.bridge) == victim.mac, "the host's entry was poisoned"
        with pytest.raises(TimeoutError):
            inbox.recv(2048)
    finally:
        port_sniffer.close()
        inbox.close()
        world.ns.sysctl(locktime, before)
