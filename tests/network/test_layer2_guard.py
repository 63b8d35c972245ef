"""Layer 2 closed from agent ports, proven with real raw frames.

An agent with CAP_NET_RAW (an AF_PACKET socket on its eth0) or a Firecracker guest (frames written
to its TAP) sends what an attacker would: ARP replies claiming the gateway's or a neighbour's
address, UDP with a forged source, behind no tag, one tag, two tags or an unknown tag protocol.
Only its own untagged IPv4/IPv6/ARP from its own MAC and address may pass the bridge. The victims
are a neighbour agent (its neighbour table, a UDP socket, a sniffer on its eth0) and the host
(its neighbour table, a UDP socket). See ``docs/nft-isolation.md``, "Layer 2".
"""

from __future__ import annotations

import secrets
import socket
import time

import pytest

from network import netlink
from network.ipalloc import mac_for_ip
from network.nft.apply import NftClient
from network.nft.spec import AgentSpec
from tests.support.frames import (
    ETH_P_ARP,
    ETH_P_IP,
    TAGS,
    Sniffer,
    arp_reply,
    ethernet,
    ipv4_udp,
    send_frames,
    write_to_tap,
)
from tests.support.network_lab import Lab
from tests.support.root import require_root

pytestmark = pytest.mark.root

GW = "10.213.0.1"
SUBNET = "10.213.0.0/24"
ATTACKER = "10.213.0.15"
VICTIM = "10.213.0.16"
VM = "10.213.0.17"
TAP = "l2tap7"
HOST_UDP = 7101
VICTIM_UDP = 7100
TAGGED = [name for name in TAGS if name != "untagged"]


@pytest.fixture(scope="module")
def lab():
    """Two agents on unisolated ports (as on docker's bridge) and a VM TAP enslaved isolated (as
    Firecracker does), neighbour entries overridable at once (locktime 0) in the victims."""
    require_root()
    lab = Lab.create()
    try:
        lab.add_agent("a5", ATTACKER, isolated=False)
        lab.add_agent("a6", VICTIM, isolated=False)
        netlink.create_tap(TAP, lab.bridge, isolated=True, netns=lab.host.name)
        lab.agents["a6"].ns.sysctl("net.ipv4.neigh.eth0.locktime", "0")
        lab.host.sysctl(f"net.ipv4.neigh.{lab.bridge}.locktime", "0")
        yield lab
    finally:
        lab.close()


@pytest.fixture
def nft(lab):
    client = NftClient(f"net_l2{secrets.token_hex(2)}", netns=lab.host.name)
    yield client
    client.delete_table()


def bridge_mac(lab) -> str:
    return lab.host.exec("cat", f"/sys/class/net/{lab.bridge}/address").stdout.strip()


def guard(lab, nft) -> None:
    """Both agents and the VM bound with their rules; the agents may reach the host's UDP port."""
    nft.ensure_table([lab.bridge], [SUBNET])
    for name in ("a5", "a6"):
        agent = lab.agents[name]
        nft.apply_agent(
            AgentSpec.build(agent.ipv4, GW, host_access=[f"{GW}:{HOST_UDP}"], port=agent.port, mac=agent.mac)
        )
    nft.apply_agent(AgentSpec.build(VM, GW, host_access=[f"{GW}:{HOST_UDP}"], port=TAP, mac=mac_for_ip(VM)))


def neighbour(ns, address: str, dev: str) -> str | None:
    """The MAC ``ns`` has for ``address`` on ``dev``, else None."""
    out = ns.ip("neigh", "show", address, "dev", dev).stdout.split()
    return out[out.index("lladdr") + 1] if "lladdr" in out else None


def seed_neighbours(lab) -> tuple[str, str]:
    """The true entries, stale (so a reply may override them): the victim's for the gateway, the
    host's for the victim. Returns ``(gateway MAC, victim MAC)``."""
    gw_mac, victim_mac = bridge_mac(lab), lab.agents["a6"].mac
    lab.agents["a6"].ns.ip("neigh", "replace", GW, "lladdr", gw_mac, "dev", "eth0", "nud", "stale")
    lab.host.ip("neigh", "replace", VICTIM, "lladdr", victim_mac, "dev", lab.bridge, "nud", "stale")
    return gw_mac, victim_mac


def poison_frames(lab, src_mac: str, tags: tuple[int, ...]) -> list[bytes]:
    """ "The gateway is at <src_mac>" to the victim, "the victim is at <src_mac>" to the host."""
    gw_mac, victim = bridge_mac(lab), lab.agents["a6"]
    return [
        ethernet(victim.mac, src_mac, ETH_P_ARP, arp_reply(src_mac, GW, victim.mac, VICTIM), tags),
        ethernet(gw_mac, src_mac, ETH_P_ARP, arp_reply(src_mac, VICTIM, gw_mac, GW), tags),
    ]


def assert_not_poisoned(lab, gw_mac: str, victim_mac: str) -> None:
    time.sleep(0.2)
    assert neighbour(lab.agents["a6"].ns, GW, "eth0") == gw_mac, "the neighbour's gateway entry was poisoned"
    assert neighbour(lab.host, VICTIM, lab.bridge) == victim_mac, "the host's entry for the neighbour was poisoned"


@pytest.mark.parametrize("tags", list(TAGS), ids=list(TAGS))
def test_arp_replies_from_an_agent_poison_no_neighbour_table(lab, nft, tags):
    guard(lab, nft)
    gw_mac, victim_mac = seed_neighbours(lab)
    attacker = lab.agents["a5"]
    send_frames(attacker.ns.name, "eth0", poison_frames(lab, attacker.mac, TAGS[tags]))
    assert_not_poisoned(lab, gw_mac, victim_mac)


@pytest.mark.parametrize("tags", list(TAGS), ids=list(TAGS))
def test_arp_replies_from_a_vm_tap_poison_no_neighbour_table(lab, nft, tags):
    guard(lab, nft)
    gw_mac, victim_mac = seed_neighbours(lab)
    write_to_tap(lab.host.name, TAP, poison_frames(lab, mac_for_ip(VM).lower(), TAGS[tags]))
    assert_not_poisoned(lab, gw_mac, victim_mac)


def test_the_controls_an_unguarded_bridge_lets_the_poison_through(lab, nft):
    """Without rules the tagged replies do poison both tables: the frames and the victims work."""
    gw_mac, victim_mac = seed_neighbours(lab)
    attacker = lab.agents["a5"]
    send_frames(attacker.ns.name, "eth0", poison_frames(lab, attacker.mac, TAGS["two 802.1Q tags"]))
    time.sleep(0.2)
    assert neighbour(lab.agents["a6"].ns, GW, "eth0") == attacker.mac
    assert neighbour(lab.host, VICTIM, lab.bridge) == attacker.mac


@pytest.mark.parametrize("tags", ["untagged", "one 802.1Q tag"])
def test_an_agent_announcing_its_own_address_is_heard_only_untagged(lab, nft, tags):
    guard(lab, nft)
    attacker = lab.agents["a5"]
    lab.host.ip("neigh", "replace", ATTACKER, "lladdr", "02:00:00:00:00:09", "dev", lab.bridge, "nud", "stale")
    gw_mac = bridge_mac(lab)
    frame = ethernet(gw_mac, attacker.mac, ETH_P_ARP, arp_reply(attacker.mac, ATTACKER, gw_mac, GW), TAGS[tags])
    send_frames(attacker.ns.name, "eth0", [frame])
    time.sleep(0.2)
    learned = neighbour(lab.host, ATTACKER, lab.bridge)
    assert learned == (attacker.mac if tags == "untagged" else "02:00:00:00:00:09")


def udp_socket(ns, address: str, port: int) -> socket.socket:
    sock = ns.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    sock.settimeout(0.6)
    return sock


def received(sock: socket.socket, marker: bytes) -> bool:
    try:
        while True:
            if marker in sock.recv(2048):
                return True
    except TimeoutError:
        return False


def forged_udp(lab, src_mac: str, tags: tuple[int, ...], marker: bytes) -> bytes:
    """UDP "from the gateway" to the victim agent's socket."""
    victim = lab.agents["a6"]
    return ethernet(victim.mac, src_mac, ETH_P_IP, ipv4_udp(GW, VICTIM, 5353, VICTIM_UDP, marker), tags)


def reaches_victim(lab, send) -> tuple[bool, bool]:
    """``(its socket got it, its eth0 saw it)`` for the frame ``send(marker)`` sends."""
    victim = lab.agents["a6"]
    marker = b"l2-" + secrets.token_hex(6).encode()
    sniffer = Sniffer(victim.ns.name, "eth0")
    sock = udp_socket(victim.ns, "0.0.0.0", VICTIM_UDP)
    try:
        send(marker)
        return received(sock, marker), sniffer.saw(marker)
    finally:
        sock.close()
        sniffer.close()


@pytest.mark.parametrize("tags", list(TAGS), ids=list(TAGS))
def test_forged_udp_from_an_agent_never_reaches_the_neighbour(lab, nft, tags):
    guard(lab, nft)
    attacker = lab.agents["a5"]
    got = reaches_victim(
        lab, lambda m: send_frames(attacker.ns.name, "eth0", [forged_udp(lab, attacker.mac, TAGS[tags], m)])
    )
    assert got == (False, False)


@pytest.mark.parametrize("tags", list(TAGS), ids=list(TAGS))
def test_forged_udp_from_a_vm_tap_never_reaches_the_neighbour(lab, nft, tags):
    guard(lab, nft)
    mac = mac_for_ip(VM).lower()
    got = reaches_victim(lab, lambda m: write_to_tap(lab.host.name, TAP, [forged_udp(lab, mac, TAGS[tags], m)]))
    assert got == (False, False)


@pytest.mark.parametrize("tags", ["two 802.1Q tags", "0x9100 tag"])
def test_the_controls_without_rules_the_neighbour_gets_the_frames(lab, nft, tags):
    attacker = lab.agents["a5"]
    got = reaches_victim(
        lab, lambda m: send_frames(attacker.ns.name, "eth0", [forged_udp(lab, attacker.mac, TAGS[tags], m)])
    )
    assert got == (tags == "two 802.1Q tags", True)


def to_host(lab, src_mac: str, src_ip: str, marker: bytes, tags: tuple[int, ...] = ()) -> bytes:
    return ethernet(bridge_mac(lab), src_mac, ETH_P_IP, ipv4_udp(src_ip, GW, 5353, HOST_UDP, marker), tags)


def reaches_host(lab, frame_for) -> bool:
    marker = b"l2-" + secrets.token_hex(6).encode()
    sock = udp_socket(lab.host, GW, HOST_UDP)
    try:
        frame_for(marker)
        return received(sock, marker)
    finally:
        sock.close()


def test_the_host_hears_an_agent_only_from_its_own_mac_and_address_untagged(lab, nft):
    guard(lab, nft)
    a = lab.agents["a5"]
    own = reaches_host(lab, lambda m: send_frames(a.ns.name, "eth0", [to_host(lab, a.mac, ATTACKER, m)]))
    assert own, "the agent's own untagged frame must reach the host port its host access opens"
    other_mac = reaches_host(
        lab, lambda m: send_frames(a.ns.name, "eth0", [to_host(lab, "02:4b:43:0f:0f:0f", ATTACKER, m)])
    )
    neighbour_mac = reaches_host(
        lab, lambda m: send_frames(a.ns.name, "eth0", [to_host(lab, lab.agents["a6"].mac, VICTIM, m)])
    )
    tagged = reaches_host(
        lab, lambda m: send_frames(a.ns.name, "eth0", [to_host(lab, a.mac, ATTACKER, m, TAGS["one 802.1Q tag"])])
    )
    assert (other_mac, neighbour_mac, tagged) == (False, False, False)


def test_a_vm_is_heard_only_with_the_guest_mac_the_console_configures(lab, nft):
    guard(lab, nft)
    guest = mac_for_ip(VM).lower()
    own = reaches_host(lab, lambda m: write_to_tap(lab.host.name, TAP, [to_host(lab, guest, VM, m)]))
    other = reaches_host(lab, lambda m: write_to_tap(lab.host.name, TAP, [to_host(lab, "06:00:ac:0f:0f:0f", VM, m)]))
    assert (own, other) == (True, False)


def test_a_flushed_bridge_table_still_keeps_ip_from_the_host(lab, nft):
    """Flushing the bridge table drops every mark: the inet guard then drops all IP to the host."""
    guard(lab, nft)
    a = lab.agents["a5"]
    nft.apply_document([{"flush": {"table": {"family": "bridge", "name": nft.table}}}])
    assert not reaches_host(lab, lambda m: send_frames(a.ns.name, "eth0", [to_host(lab, a.mac, ATTACKER, m)]))


@pytest.mark.parametrize("tags", list(TAGS), ids=list(TAGS))
def test_an_agent_before_its_binding_poisons_nothing_either(lab, nft, tags):
    """A container before its rules (or an orphan) is on no binding: the netdev guard drops its
    ARP to the host whatever its tags, and nothing is bridged to a bound neighbour."""
    guard(lab, nft)
    nft.remove_agent(ATTACKER)
    gw_mac, victim_mac = seed_neighbours(lab)
    attacker = lab.agents["a5"]
    send_frames(attacker.ns.name, "eth0", poison_frames(lab, attacker.mac, TAGS[tags]))
    assert_not_poisoned(lab, gw_mac, victim_mac)
