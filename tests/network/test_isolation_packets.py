"""Isolation proven with real TCP and UDP packets.

A "host" namespace with a bridge, agents behind it on isolated ports, a "lan" namespace routed
behind the host (see tests/support/network_lab.py). The rules are rendered by network.nft.render and applied by
NftClient inside the host namespace, exactly as a console applies them on the real host.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket

import pytest

from network import netlink
from network.host_access import resolve_agent_host_access
from network.nft.apply import NftClient
from network.nft.spec import AgentSpec
from tests.support.network_lab import HELLO, Lab, Target, both, reachability
from tests.support.root import require_root

pytestmark = pytest.mark.root

GW = "10.213.0.1"
GW6 = "fd13::1"
CONSOLE_URL = f"ws://{GW}:4000/ws"

# What the default host access (gateway DNS + the console port) must open and close on the host.
HOST_OPEN = both(GW, 53, 4000)
# The console's port on any other host address (the operator listener may be there) stays closed.
HOST_CLOSED = both(GW, 4001, 9000) + both("10.99.0.1", 53, 4000, 9000) + both("169.254.1.1", 53, 4000, 9000)
# RFC1918, link-local, shared address space and the host's own non-RFC1918 connected subnet.
FORWARD_DROPPED = both("10.214.0.2", 80) + both("169.254.169.254", 80) + both("100.64.0.7", 80)
FORWARD_DROPPED += both("198.51.100.2", 80)
FORWARD_OTHER = both("203.0.113.7", 80)
HOST_V6 = both(GW6, 4000) + both(GW6, 9000)


@pytest.fixture(scope="module")
def lab():
    require_root()
    lab = Lab.create()
    try:
        lab.add_agent("a1", "10.213.0.5", "fd13::5")
        lab.add_agent("a2", "10.213.0.6", "fd13::6")
        lab.add_agent("a3", None, "fd13::7")  # an IPv6-addressed agent
        lab.add_agent("a4", "10.213.0.9", "fd13::9")  # never given rules
        yield lab
    finally:
        lab.close()


@pytest.fixture
def nft(lab):
    client = NftClient(f"net_iso{secrets.token_hex(2)}", netns=lab.host.name)
    yield client
    client.delete_table()


def default_spec(address="10.213.0.5", **kw):
    kw.setdefault("host_access", resolve_agent_host_access(None, CONSOLE_URL, GW, []))
    return AgentSpec.build(address, GW, **kw)


SUBNET = "10.213.0.0/24"


def bound(lab, spec):
    """``spec`` bound to the port and MAC of the lab agent holding its address (as a backend binds it)."""
    if spec.port:
        return spec
    for agent in lab.agents.values():
        if str(spec.address) in (agent.ipv4, agent.ipv6):
            return dataclasses.replace(spec, port=agent.port, mac=agent.mac)
    return spec


def apply(lab, nft, *specs):
    nft.ensure_table([lab.bridge], [SUBNET])
    for spec in specs:
        nft.apply_agent(bound(lab, spec))


def probe(lab, agent, targets):
    return reachability(lab.agents[agent].ns, targets)


def assert_all(results, expected: bool):
    wrong = [t for t, ok in results.items() if ok is not expected]
    assert not wrong, f"expected {'open' if expected else 'closed'}: {wrong}"


def test_without_rules_every_target_is_reachable(lab, nft):
    """The control: every target below is open until rules say otherwise (so 'closed' means the rules)."""
    assert_all(probe(lab, "a1", HOST_OPEN + HOST_CLOSED + FORWARD_DROPPED + FORWARD_OTHER + HOST_V6), True)


def test_the_default_host_access_opens_gateway_dns_and_the_console_port_only(lab, nft):
    spec = default_spec()
    assert [e.canonical for e in spec.host_access] == [f"{GW}:53", f"{GW}:4000"]
    apply(lab, nft, spec)
    assert_all(probe(lab, "a1", HOST_OPEN), True)
    assert_all(probe(lab, "a1", HOST_CLOSED), False)


def test_private_and_link_local_destinations_are_dropped_on_forward(lab, nft):
    apply(lab, nft, default_spec())
    assert_all(probe(lab, "a1", FORWARD_DROPPED), False)
    assert_all(probe(lab, "a1", FORWARD_OTHER), True)


def test_deny_all_closes_everything_but_the_gateway_and_the_allowlist(lab, nft):
    apply(lab, nft, default_spec(deny_all=True, allowlist=["10.214.0.2/32"]))
    assert_all(probe(lab, "a1", both("10.214.0.2", 80) + both(GW, 53)), True)
    assert_all(probe(lab, "a1", FORWARD_OTHER + both("169.254.169.254", 80) + both(GW, 4001)), False)


def test_the_hosts_connected_subnets_and_shared_address_space_are_dropped_unless_allowlisted(lab, nft):
    """The host's uplink LAN (198.51.100.0/24 here, no RFC1918 range) is read from the host's
    addresses when the base is written; 100.64/10 is always dropped. An allowlist entry opens one."""
    neighbour, shared = both("198.51.100.2", 80), both("100.64.0.7", 80)
    apply(lab, nft, default_spec())
    assert "198.51.100.0/24" in [str(n) for n in nft.list_address_sets()["hostnets4"]]
    assert_all(probe(lab, "a1", neighbour + shared), False)
    assert_all(probe(lab, "a1", FORWARD_OTHER), True)
    apply(lab, nft, default_spec(allowlist=["198.51.100.2", "100.64.0.0/10"]))
    assert_all(probe(lab, "a1", neighbour + shared + FORWARD_OTHER), True)


def test_an_allowlisted_private_address_is_reachable_without_deny_all(lab, nft):
    apply(lab, nft, default_spec(allowlist=["10.214.0.2"]))
    assert_all(probe(lab, "a1", both("10.214.0.2", 80)), True)
    assert_all(probe(lab, "a1", both("169.254.169.254", 80)), False)


def test_an_empty_host_access_still_lets_host_opened_connections_get_replies(lab, nft):
    apply(lab, nft, default_spec(host_access=[]))
    assert_all(probe(lab, "a1", both(GW, 53, 4000)), False)
    from_host = reachability(lab.host, both("10.213.0.5", lab.agent_port))
    assert_all(from_host, True)


def test_the_other_agent_is_unreachable(lab, nft):
    apply(lab, nft, default_spec("10.213.0.5"), default_spec("10.213.0.6"))
    assert_all(probe(lab, "a1", both("10.213.0.6", 7000) + both("fd13::6", 7000)), False)
    assert_all(probe(lab, "a2", both("10.213.0.5", 7000) + both("fd13::5", 7000)), False)


def test_bridge_port_isolation_alone_keeps_agents_apart(lab, nft):
    """No nft rules at all: isolated ports cannot talk; one port un-isolated, they can."""
    peer = both("10.213.0.6", 7000)
    assert_all(probe(lab, "a1", peer), False)
    netlink.set_port_isolation("a2", False, netns=lab.host.name)
    try:
        assert_all(probe(lab, "a1", peer), True)
    finally:
        netlink.set_port_isolation("a2", True, netns=lab.host.name)
    assert netlink.port_isolated("a2", netns=lab.host.name)
    assert_all(probe(lab, "a1", peer), False)


def test_ipv6_from_an_ipv4_agent_is_dropped_even_when_an_entry_names_it(lab, nft):
    apply(lab, nft, default_spec(host_access=["*:4000", f"[{GW6}]:4000"]))
    assert_all(probe(lab, "a1", HOST_V6), False)
    assert_all(probe(lab, "a1", both(GW, 4000)), True)


def test_an_ipv6_agent_reaches_only_its_bracketed_entries(lab, nft):
    apply(lab, nft, AgentSpec.build("fd13::7", GW6, host_access=[f"[{GW6}]:4000", "*:9000"]))
    assert_all(probe(lab, "a3", both(GW6, 4000)), True)
    assert_all(probe(lab, "a3", both(GW6, 9000, 53)), False)  # *:9000 is IPv4 only


def test_an_address_without_rules_reaches_nothing_through_a_guarded_bridge(lab, nft):
    nft.ensure_table()  # no guard yet: an unmapped address falls through to policy accept
    nft.apply_agent(default_spec())
    assert_all(probe(lab, "a4", both(GW, 4000)), True)
    nft.ensure_table([lab.bridge], [SUBNET])
    assert_all(probe(lab, "a4", both(GW, 53, 4000) + FORWARD_OTHER + both(GW6, 4000)), False)


def link_local(lab, ifname=None) -> str:
    """The bridge's IPv6 link-local address, scoped for a probe from an agent (``fe80::…%eth0``),
    once no address in the lab is still tentative (duplicate address detection takes ~1 s)."""
    import time

    namespaces = [lab.host] + [a.ns for a in lab.agents.values()]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        ns.ip("-6", "addr", "show", "tentative").stdout.strip() for ns in namespaces
    ):
        time.sleep(0.1)
    out = lab.host.ip("-6", "-o", "addr", "show", "dev", ifname or lab.bridge, "scope", "link").stdout
    return out.split()[3].split("/")[0] + "%eth0"


def test_an_unknown_source_on_the_bridge_reaches_nothing_over_ipv4_or_ipv6_link_local(lab, nft):
    """a4 has an address on the bridge no rule was written for (a container before its rules, an
    orphan, a stranger): with a real agent bound beside it, it reaches no host port and nothing
    beyond, over IPv4, the gateway's IPv6 address, or the bridge's link-local address."""
    ll = link_local(lab)
    assert_all(probe(lab, "a4", both(GW, 4000) + both(ll, 4000)), True)  # control: open without the guard
    apply(lab, nft, default_spec())
    assert_all(probe(lab, "a1", both(GW, 53, 4000)), True)
    assert_all(probe(lab, "a4", both(GW, 53, 4000, 9000) + FORWARD_OTHER + both(GW6, 4000) + both(ll, 4000)), False)


def test_ipv6_link_local_from_a_bound_agent_is_dropped(lab, nft):
    apply(lab, nft, default_spec(host_access=["*:4000", "4000"]))
    assert_all(probe(lab, "a1", both(GW, 4000)), True)
    assert_all(probe(lab, "a1", both(link_local(lab), 4000, 9000)), False)


def tcp_from(ns, source: str, host: str, port: int, timeout: float = 0.6) -> bool:
    """A TCP connect from ``source`` (an address the namespace holds) to host:port, with hello."""
    sock = ns.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.bind((source, 0))
        sock.connect((host, port))
        return sock.recv(16) == HELLO
    except OSError:
        return False
    finally:
        sock.close()


def test_a_spoofed_neighbour_address_gets_nothing(lab, nft):
    """a4 claims a1's address (a container keeps NET_RAW; any source can be forged): the (port,
    address) pair is a1's port only, so a4's packets from 10.213.0.5 stop at the guard."""
    apply(lab, nft, default_spec())
    a4 = lab.agents["a4"].ns
    a4.ip("addr", "add", "10.213.0.5/32", "dev", "eth0", "nodad")
    try:
        assert tcp_from(lab.agents["a1"].ns, "10.213.0.5", GW, 4000)
        assert not tcp_from(a4, "10.213.0.5", GW, 4000)
        assert not tcp_from(a4, "10.213.0.5", GW, 53)
        assert not tcp_from(a4, "10.213.0.5", "203.0.113.7", 80)
        assert tcp_from(lab.agents["a1"].ns, "10.213.0.5", GW, 4000), "the spoofer's ARP took a1's replies"
    finally:
        a4.ip("addr", "del", "10.213.0.5/32", "dev", "eth0")


@pytest.fixture(params=["0", "1"], ids=["br_netfilter-off", "br_netfilter-on"])
def br_netfilter(request, lab):
    """``bridge-nf-call-iptables`` / ``-ip6tables`` in the host namespace: bridged frames pass
    through the inet hooks (1) or not (0). Isolation must hold either way."""
    keys = ("net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables")
    before = [lab.host.exec("sysctl", "-n", k).stdout.strip() for k in keys]
    for k in keys:
        lab.host.sysctl(k, request.param)
    yield request.param
    for k, v in zip(keys, before, strict=True):
        lab.host.sysctl(k, v)


def test_agents_on_unisolated_ports_cannot_reach_each_other(lab, nft, br_netfilter):
    """Agent containers share a bridge without port isolation: the bridge table alone keeps them
    apart, over IPv4 and over IPv6 link-local (agent MACs), with br_netfilter on or off."""
    from network.nft.names import AGENT_MAC_PREFIX

    peer4 = both("10.213.0.6", 7000)
    macs = {name: lab.agents[name].mac for name in ("a1", "a2")}
    for name, mac in (("a1", "01"), ("a2", "02")):
        netlink.set_port_isolation(name, False, netns=lab.host.name)
        lab.agents[name].mac = f"{AGENT_MAC_PREFIX}:00:00:{mac}"  # bound with the MAC it now has
        lab.agents[name].ns.ip("link", "set", "eth0", "address", lab.agents[name].mac)
    for name in ("a1", "a2"):  # fixed link-local addresses, usable at once (no DAD)
        lab.agents[name].ns.ip("-6", "addr", "add", f"fe80::{name}/64", "dev", "eth0", "nodad")
    try:
        peer6 = both("fe80::a2%eth0", 7000)
        control = reachability(lab.agents["a1"].ns, peer4 + peer6, timeout=2.0)
        assert_all(control, True)  # control: nothing else keeps them apart
        apply(lab, nft, default_spec("10.213.0.5"), default_spec("10.213.0.6"))
        assert_all(probe(lab, "a1", peer4 + peer6), False)
        assert_all(probe(lab, "a2", both("10.213.0.5", 7000)), False)
        assert_all(probe(lab, "a1", both(GW, 4000)), True)
    finally:
        for name in ("a1", "a2"):
            lab.agents[name].ns.ip("-6", "addr", "del", f"fe80::{name}/64", "dev", "eth0")
            lab.agents[name].ns.ip("link", "set", "eth0", "address", macs[name])
            lab.agents[name].mac = macs[name]
            netlink.set_port_isolation(name, True, netns=lab.host.name)


def test_a_flushed_table_fails_closed_until_the_rules_are_back(lab, nft):
    """``nft flush table`` of either table leaves the guard chain's drop policy in force: a bound
    agent reaches nothing until the base and its rules are re-applied."""
    spec = default_spec()
    apply(lab, nft, spec)
    assert_all(probe(lab, "a1", both(GW, 4000)), True)
    for family in ("inet", "bridge"):
        lab.host.exec("nft", "flush", "table", family, nft.table)
        assert_all(probe(lab, "a1", both(GW, 53, 4000, 9000) + FORWARD_OTHER + FORWARD_DROPPED), False)
        nft.self_heal([bound(lab, spec)], [lab.bridge], [SUBNET])
        assert_all(probe(lab, "a1", both(GW, 4000)), True)
        assert_all(probe(lab, "a1", both(GW, 9000)), False)


def test_two_consoles_on_one_bridge_each_keep_exactly_their_own_policy(lab, nft):
    """Two tables guard the same bridge: each console's guard passes the other's bound agents
    (one mark bit, set by whichever table binds the pair), each table judges only its own, and
    an address neither bound reaches nothing."""
    other = NftClient(f"net_iso{secrets.token_hex(2)}", netns=lab.host.name)
    try:
        apply(lab, nft, default_spec("10.213.0.5", host_access=[f"{GW}:53"]))
        other.ensure_table([lab.bridge], [SUBNET])
        other.apply_agent(bound(lab, default_spec("10.213.0.6", host_access=["*:4000"])))
        assert_all(probe(lab, "a1", both(GW, 53)), True)
        assert_all(probe(lab, "a1", both(GW, 4000)), False)
        assert_all(probe(lab, "a2", both(GW, 4000)), True)
        assert_all(probe(lab, "a2", both(GW, 53)), False)
        assert_all(probe(lab, "a4", both(GW, 53, 4000)), False)
    finally:
        other.delete_table()


def test_removing_an_agent_leaves_its_address_closed(lab, nft):
    apply(lab, nft, default_spec())
    assert_all(probe(lab, "a1", both(GW, 53)), True)
    assert nft.remove_agent("10.213.0.5")
    assert_all(probe(lab, "a1", both(GW, 53) + FORWARD_OTHER), False)


def test_replacing_the_rules_takes_effect_for_new_connections(lab, nft):
    apply(lab, nft, default_spec(host_access=["*:4000"]))
    assert probe(lab, "a1", [Target("tcp", GW, 4000), Target("tcp", GW, 9000)]) == {
        f"tcp:{GW}:4000": True,
        f"tcp:{GW}:9000": False,
    }
    nft.apply_agent(bound(lab, default_spec(host_access=["*:9000"])))
    assert probe(lab, "a1", [Target("tcp", GW, 4000), Target("tcp", GW, 9000)]) == {
        f"tcp:{GW}:4000": False,
        f"tcp:{GW}:9000": True,
    }


def _exchange(sock, data: bytes) -> bytes | None:
    """Send ``data`` on an open connection; the echo, or None when nothing came back in 1 s."""
    sock.sendall(data)
    try:
        return sock.recv(64)
    except (TimeoutError, OSError):
        return None


def test_a_connection_the_agent_opened_before_its_rules_stops_passing_once_they_apply(lab, nft):
    """The container runs for a moment before its rules are written. A connection it opened to a
    host port in that moment must not survive them: only replies to host-opened flows pass by
    conntrack state; the agent's own packets are re-checked against its entries."""
    import socket

    from tests.support.network_lab import EchoListener

    # As on a live host: the table is there (no guard on the shared bridge) and another agent's
    # rules already have conntrack tracking every flow, so the early connection is tracked.
    nft.ensure_table()
    nft.apply_agent(default_spec("10.213.0.6"))
    denied, allowed = EchoListener(lab.host, 9100), EchoListener(lab.host, 9101)
    agent = lab.agents["a1"].ns
    early, kept = agent.socket(socket.AF_INET, socket.SOCK_STREAM), agent.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        for sock, port in ((early, 9100), (kept, 9101)):
            sock.settimeout(1.0)
            sock.connect((GW, port))
            assert _exchange(sock, b"before") == b"before"  # no rules for a1 yet: both pass
        nft.apply_agent(default_spec(host_access=[f"{GW}:53", "*:9101"]))
        assert _exchange(early, b"after") is None, "an agent-opened connection to a closed host port survived the rules"
        assert _exchange(kept, b"after") == b"after", "a connection through an allowed entry must keep working"
        assert probe(lab, "a1", [Target("tcp", GW, 9100)]) == {f"tcp:{GW}:9100": False}
    finally:
        early.close()
        kept.close()
        denied.close()
        allowed.close()


def test_replies_to_a_connection_the_host_opened_before_the_rules_keep_passing(lab, nft):
    """Reply direction is what conntrack still lets through: the agent answering the host, even
    with an empty host access."""
    import socket

    from tests.support.network_lab import EchoListener

    nft.ensure_table()
    nft.apply_agent(default_spec("10.213.0.6"))  # conntrack is on, as on a live host
    echo = EchoListener(lab.agents["a1"].ns, 7100)
    sock = lab.host.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.connect(("10.213.0.5", 7100))
        assert _exchange(sock, b"before") == b"before"
        nft.apply_agent(default_spec(host_access=[]))
        assert _exchange(sock, b"after") == b"after"
    finally:
        sock.close()
        echo.close()
    assert_all(reachability(lab.host, both("10.213.0.5", lab.agent_port)), True)


# -- the live self-test (network.selftest) ----------------------------------------------------


def selftest_targets(spec):
    from network.selftest import default_selftest_targets

    return default_selftest_targets(
        spec,
        other_agents=["10.213.0.6"],
        private_canaries=[("10.214.0.2", 80), ("169.254.169.254", 80)],
        host_sample_ports=(22, 4001, 9000),
        metadata=None,
        public=("203.0.113.7", 80),
        agent_port=7000,
        console_port=4000,
        host_addresses=[GW, "10.99.0.1", "169.254.1.1", "127.0.0.1", GW6],
    )


def table(results):
    return {f"{r.target}": (r.state, r.passed) for r in results}


def guard(lab, agent="10.213.0.5"):
    from network.probe_guard import ProbeGuard

    return ProbeGuard.for_gateway(agent, GW, lab.host.name)


def run_selftest(lab, nft, spec, netns=None):
    import ipaddress

    from network.selftest import run_isolation_selftest

    rules = nft.list_agents().get(ipaddress.ip_address(str(spec.address)))
    return run_isolation_selftest(
        netns or lab.agents["a1"].ns.name, selftest_targets(spec), timeout=0.5,
        guard=guard(lab, str(spec.address)), rules=rules, sets=nft.list_address_sets(),
    )  # fmt: skip


class LanCounter:
    """Counts packets from an agent address arriving in the lab's "lan" namespace (beyond the host:
    where a probe must never go), with an nft counter of its own."""

    def __init__(self, lab, source="10.213.0.5"):
        self.lab, self.table = lab, f"sec_count{secrets.token_hex(2)}"
        rules = (
            f"table inet {self.table} {{\n chain pre {{\n  type filter hook prerouting priority -300; policy accept;\n"
            f"  ip saddr {source} counter\n }}\n}}\n"
        )
        import subprocess

        subprocess.run(["ip", "netns", "exec", lab.lan.name, "nft", "-f", "-"], input=rules, text=True, check=True)

    def packets(self) -> int:
        import json

        out = self.lab.lan.exec("nft", "-j", "list", "table", "inet", self.table).stdout
        items = json.loads(out)["nftables"]
        return sum(e["counter"]["packets"] for i in items if "rule" in i for e in i["rule"]["expr"] if "counter" in e)

    def close(self):
        self.lab.lan.exec("nft", "delete", "table", "inet", self.table, check=False)


def test_the_route_guard_lets_probes_reach_only_host_addresses_and_the_bridge(lab):
    g = guard(lab)
    assert [(d, g.check(d).where) for d in (GW, "10.99.0.1", "10.213.0.6")] == [
        (GW, "local"),
        ("10.99.0.1", "local"),
        ("10.213.0.6", "bridge"),
    ]
    for dst, dev in (("10.214.0.2", "lan0"), ("203.0.113.7", "lan0"), ("169.254.169.254", "lan0")):
        check = g.check(dst)
        assert (check.ok, check.where, check.dev) == (False, "leaves", dev)
        assert f"the route to {dst} leaves through lan0" in check.detail
    # A host that does not forward answers "No route to host" for the agent: the host's own route decides.
    lab.host.sysctl("net.ipv4.ip_forward", "0")
    try:
        g = guard(lab)
        assert g.check("10.213.0.6").where == "bridge" and g.check(GW).where == "local"
        assert g.check("203.0.113.7").where == "leaves" and not g.check("203.0.113.7").ok
    finally:
        lab.host.sysctl("net.ipv4.ip_forward", "1")


def test_the_self_test_passes_when_isolation_holds_and_sends_nothing_beyond_the_host(lab, nft):
    spec = default_spec()
    apply(lab, nft, spec, default_spec("10.213.0.6"))
    lan = LanCounter(lab)
    try:
        before = lan.packets()
        results = run_selftest(lab, nft, spec)
        assert lan.packets() == before, "a self-test probe reached the network beyond the host"
    finally:
        lan.close()
    got = table(results)
    peer_state, peer_passed = got.pop("tcp 10.213.0.6:7000")
    assert (
        peer_state in ("filtered", "unreachable") and peer_passed is True
    )  # probed: no ARP answer across isolated ports
    assert got == {
        "tcp 10.213.0.1:53": ("open", True),
        "tcp 10.213.0.1:4000": ("open", True),
        "tcp 10.213.0.1:22": ("filtered", True),
        "tcp 10.213.0.1:4001": ("filtered", True),
        "tcp 10.213.0.1:9000": ("filtered", True),
        "tcp 10.99.0.1:4000": ("filtered", True),  # the console's port off the gateway stays closed
        "tcp 10.214.0.2:80": ("blocked-by-rule", True),
        "tcp 169.254.169.254:80": ("blocked-by-rule", True),
        "tcp 203.0.113.7:80": ("allowed-by-rule", True),  # no denyAll: the public stand-in is allowed
    }
    by_target = {str(r.target): r for r in results}
    assert by_target["tcp 169.254.169.254:80"].observed == "blocked by rule (verified, not probed)"
    assert by_target["tcp 169.254.169.254:80"].detail == "never probed; forward rule 2: ip daddr @private4 drop"
    assert not by_target["tcp 10.214.0.2:80"].probed and by_target["tcp 10.213.0.1:53"].probed
    assert all(r.elapsed_s < 2 for r in results)


def test_deny_all_is_verified_for_the_public_address_without_a_packet(lab, nft):
    spec = default_spec(deny_all=True)
    apply(lab, nft, spec)
    got = table(run_selftest(lab, nft, spec))
    assert got["tcp 203.0.113.7:80"] == ("blocked-by-rule", True)


def test_the_self_test_fails_loudly_without_rules_and_still_sends_nothing_beyond_the_host(lab, nft):
    import subprocess

    sleeper = subprocess.Popen(["ip", "netns", "exec", lab.agents["a1"].ns.name, "sleep", "30"])
    lan = LanCounter(lab)
    try:
        import time

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait until the child has joined the namespace
            if (
                os.stat(f"/proc/{sleeper.pid}/ns/net").st_ino
                == os.stat(f"/run/netns/{lab.agents['a1'].ns.name}").st_ino
            ):
                break
            time.sleep(0.02)
        before = lan.packets()
        spec = default_spec(host_access=[f"{GW}:53", "*:4000", "10.214.0.2:80"])  # the last is not a host address
        results = run_selftest(lab, nft, spec, netns=str(sleeper.pid))
        assert lan.packets() == before, "with isolation broken, a self-test probe left the host"
        assert probe(lab, "a1", [Target("tcp", "10.214.0.2", 80)]) == {"tcp:10.214.0.2:80": True}
        assert lan.packets() > before, "the counter must see what does leave (else the check above proves nothing)"
    finally:
        lan.close()
        sleeper.kill()
        sleeper.wait()
    got = table(results)
    assert got["tcp 10.213.0.1:4001"] == ("open", False)
    assert got["tcp 10.213.0.1:22"] == ("refused", False)  # reached the host: closed, not isolated
    assert got["tcp 10.213.0.1:53"] == ("open", True)
    assert got["tcp 10.214.0.2:80"] == ("unverified", False)  # never probed: no rules to verify
    assert got["tcp 169.254.169.254:80"] == ("unverified", False)
    entry = next(r for r in results if r.target.label == "hostAccess 10.214.0.2:80")
    assert not entry.probed and entry.passed is None
    assert entry.detail.startswith("the route to 10.214.0.2 leaves through lan0: not probed; ")


@pytest.mark.django_db
def test_the_agent_page_self_test_shows_verified_rows_and_probes_only_locally(lab, nft, settings, client):
    from django.contrib.auth.models import Permission, User

    from agents.models import Agent
    from scalers.models import ConfigState, Scaler

    settings.KICI_FIRECRACKER_NETNS = lab.host.name
    ConfigState.objects.update_or_create(pk=1, defaults={"firecracker": {"table": nft.table, "gateway": GW}})
    scaler = Scaler.objects.create(name="sec-selftest", type="firecracker", max_agents=2)
    host_access = [f"{GW}:53", "*:4000"]
    agent = Agent.objects.create(
        agent_id="scaler-firecracker-5ec0a001", scaler=scaler, state="running", ip="10.213.0.5",
        host_access=host_access, backend_context={"netns": lab.agents["a1"].ns.name},
    )  # fmt: skip
    apply(lab, nft, default_spec(host_access=host_access))
    user = User.objects.create_user("sec-op")
    for app, codename in (("agents", "view_agent"), ("operations", "request_operation")):
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    client.force_login(user)
    lan = LanCounter(lab)
    try:
        before = lan.packets()
        html = client.post(f"/agents/{agent.agent_id}/isolation/selftest").content.decode()
        assert lan.packets() == before
    finally:
        lan.close()
    assert 'id="selftest-verdict"' in html and "Isolation holds" in html, html
    assert html.count("blocked by rule (verified, not probed)") == 4  # three RFC1918 canaries and the metadata service
    assert "allowed by rule (verified, not probed)" in html  # the public stand-in, no denyAll
    assert "never probed; forward rule 2: ip daddr @private4 drop" in html
    assert 'id="selftest-method"' in html and "verified from the rules in force, never probed" in html
