"""The rule evaluator behind the self-test's "blocked by rule (verified, not probed)"
(network.nft.verdict): a packet walked through an agent's rendered chains. The same evaluation over
rules read back from the kernel is exercised in tests/network/test_isolation_packets.py."""

from __future__ import annotations

import ipaddress

from network.nft.exprs import PRIVATE_DROPS, forward_rule_exprs, input_rule_exprs
from network.nft.spec import AgentSpec
from network.nft.verdict import ChainVerdict, Packet, chain_verdict

#: As a host with the LAN 198.51.100.0/24 and 2001:db8:5::/64 on its uplink has them.
SETS = {
    "private4": list(PRIVATE_DROPS),
    "hostnets4": [ipaddress.ip_network("198.51.100.0/24")],
    "hostnets6": [ipaddress.ip_network("2001:db8:5::/64")],
}


def fwd(dst, **spec_kw):
    spec = AgentSpec.build("172.30.0.5", "172.30.0.1", **spec_kw)
    return chain_verdict(forward_rule_exprs(spec), Packet(ipaddress.ip_address(dst), "tcp", 80), SETS)


def test_private_and_metadata_destinations_are_dropped_by_the_private_set_rule():
    for dst in ("10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254"):
        assert fwd(dst) == ChainVerdict("drop", 1, "ip daddr @private4 drop")


def test_a_public_destination_is_accepted_unless_deny_all_and_the_allowlist_comes_first():
    assert fwd("203.0.113.10") == ChainVerdict("accept", 5, "accept")
    assert fwd("203.0.113.10", deny_all=True) == ChainVerdict("drop", 4, "drop")
    assert fwd("10.1.2.3", allowlist=["10.1.0.0/16"]) == ChainVerdict("accept", 1, "ip daddr 10.1.0.0/16 accept")
    assert fwd("172.30.0.1").verdict == "accept"  # the gateway


def test_shared_address_space_and_the_hosts_own_subnets_are_dropped_unless_allowlisted():
    assert fwd("100.64.0.7") == ChainVerdict("drop", 1, "ip daddr @private4 drop")
    assert fwd("198.51.100.20") == ChainVerdict("drop", 2, "ip daddr @hostnets4 drop")
    assert fwd("2001:db8:5::20") == ChainVerdict("drop", 3, "ip6 daddr @hostnets6 drop")
    assert fwd("2001:db8:6::20") == ChainVerdict("drop", 4, "meta nfproto ipv6 drop")
    allowed = fwd("198.51.100.20", allowlist=["198.51.100.20"])
    assert allowed == ChainVerdict("accept", 1, "ip daddr 198.51.100.20 accept")


def test_the_input_chain_accepts_by_state_only_in_the_reply_direction():
    rules = input_rule_exprs(AgentSpec.build("172.30.0.5", "172.30.0.1", host_access=["*:4000"]))
    gw = ipaddress.ip_address("172.30.0.1")
    assert chain_verdict(rules, Packet(gw, "tcp", 4000)).verdict == "accept"
    assert chain_verdict(rules, Packet(gw, "tcp", 9000, ct_state="established")).blocks
    assert chain_verdict(rules, Packet(gw, "tcp", 9000, ct_state="established", ct_direction="reply")).index == 0


def test_a_rule_it_cannot_read_stops_the_walk_as_unknown():
    rules = [
        [{"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 1}}, {"accept": None}],
        [{"drop": None}],
    ]
    assert chain_verdict(rules, Packet(ipaddress.ip_address("10.0.0.1"), "tcp", 80)).verdict == "unknown"
    unknown_set = {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@nope"}}
    assert (
        chain_verdict([[unknown_set, {"drop": None}]], Packet(ipaddress.ip_address("10.0.0.1")), {}).verdict
        == "unknown"
    )
    assert chain_verdict([], Packet(ipaddress.ip_address("10.0.0.1"))).verdict == "fallthrough"
