"""Rule expressions in nft JSON (schema 1, as nft 1.0.6 reads and prints it): the base chains, the
guard and bridge chains, and an agent's forward and input chains. Pure; see
:mod:`network.nft.render` for the layout.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

from network.host_access import HostAccessEntry

from .names import (
    AGENT_MAC_PREFIX,
    AGENT_PORTS_SET,
    BRIDGE_FORWARD_CHAIN,
    BRIDGE_PORT_GUARD_CHAIN,
    BRIDGE_PREROUTING_CHAIN,
    FORWARD_CHAIN,
    GUARD_MARK,
    GUARD_NETS_SET,
    HOST_NETS_SETS,
    INPUT_CHAIN,
    MAPS,
    PORT_SETS,
    PRIVATE_SET,
)
from .spec import AgentSpec, IPAddress, IPNetwork

# Dropped on forward after the gateway and allowlist accepts: RFC1918, link-local (which covers
# the 169.254.169.254 metadata service) and shared address space 100.64/10 (RFC 6598: carrier-grade
# NAT, often the host's LAN neighbours).
PRIVATE_DROPS = tuple(
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10")
)


def _match(left: dict, right: Any, op: str = "==") -> dict:
    return {"match": {"op": op, "left": left, "right": right}}


def _payload(protocol: str, fld: str) -> dict:
    return {"payload": {"protocol": protocol, "field": fld}}


def _addr_right(net: IPNetwork) -> Any:
    if net.prefixlen == net.max_prefixlen:
        return str(net.network_address)
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


def _daddr(net: IPNetwork) -> dict:
    return _match(_payload("ip" if net.version == 4 else "ip6", "daddr"), _addr_right(net))


def _nfproto(family: str) -> dict:
    return _match({"meta": {"key": "nfproto"}}, family)


ACCEPT = {"accept": None}
DROP = {"drop": None}


def _as_net(addr: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(addr)


_PRIVATE_DROP = [_match(_payload("ip", "daddr"), f"@{PRIVATE_SET}"), DROP]
# The host's own connected subnets (its LAN neighbours, whatever their range), both families.
_HOST_NETS_DROPS = [
    [_match(_payload("ip", "daddr"), f"@{HOST_NETS_SETS[4]}"), DROP],
    [_match(_payload("ip6", "daddr"), f"@{HOST_NETS_SETS[6]}"), DROP],
]
_V6_DROP = [_nfproto("ipv6"), DROP]
# Replies to flows the HOST opened (ct direction reply), never the agent's own packets: a flow the
# agent opened before its rules existed (the container runs briefly before they are written) would
# otherwise stay established and bypass the entries below for its whole life.
_CT_ACCEPT = [
    _match({"ct": {"key": "direction"}}, "reply"),
    _match({"ct": {"key": "state"}}, ["established", "related"], op="in"),
    ACCEPT,
]


def forward_rule_exprs(spec: AgentSpec) -> list[list[dict]]:
    """The agent's forward chain, head to tail, as expression lists: the private-range drops are one
    lookup in the ``private4`` interval set, then the host's connected subnets (``hostnets4``/``6``)
    are dropped, so an allowlist entry placed before is the only way to them (docs/nft-isolation.md).
    The lists are shared between agents of one policy: do not mutate.
    """
    return _forward_rules(spec.gateway, spec.allowlist, spec.deny_all)


@functools.lru_cache(maxsize=256)
def _forward_rules(gateway: IPAddress, allowlist: tuple[IPNetwork, ...], deny_all: bool) -> list[list[dict]]:
    rules = [[_daddr(_as_net(gateway)), ACCEPT]]
    rules += [[_daddr(net), ACCEPT] for net in allowlist]
    rules.append(_PRIVATE_DROP)
    rules += _HOST_NETS_DROPS
    if deny_all:
        rules.append([DROP])
    else:
        rules.append(_V6_DROP)
        rules.append([ACCEPT])
    return rules


@functools.lru_cache(maxsize=1024)
def host_access_rule_exprs(entry: HostAccessEntry) -> list[list[dict]]:
    """Input rules for one entry: tcp and udp when it has a port, else one rule.

    Wildcard entries are restricted to IPv4 (``meta nfproto ipv4``); see the module doc.
    """
    head = [_nfproto("ipv4")] if entry.daddr is None else [_daddr(entry.daddr)]
    if entry.port is None:
        return [head + [ACCEPT]]
    return [head + [_match(_payload(proto, "dport"), entry.port), ACCEPT] for proto in ("tcp", "udp")]


def input_rule_exprs(spec: AgentSpec) -> list[list[dict]]:
    """The agent's input chain, head to tail: reply-direction ct accept, entries, drop. A flow the agent
    opened is checked against the entries packet by packet, so one opened before the rules stops at
    their first packet (docs/nft-isolation.md, "Input conntrack and the container start-up gap").
    """
    rules = [_CT_ACCEPT]
    for entry in spec.host_access:
        rules += host_access_rule_exprs(entry)
    rules.append([DROP])
    return rules


def base_rule_exprs() -> dict[str, list[list[dict]]]:
    """Rules of the two base chains (see the module doc), by chain name. Addresses in no map fall
    through to the chain's accept: they are another console's agents (its own table judges them)
    or traffic that never came from an agent bridge; unknown sources on a bridge are the guard's."""

    def vmap(proto: str, name: str) -> list[dict]:
        return [{"vmap": {"key": _payload(proto, "saddr"), "data": f"@{name}"}}]

    nd = [
        _match(_payload("icmpv6", "type"), {"set": ["nd-neighbor-solicit", "nd-neighbor-advert"]}),
        _match(_payload("ip6", "hoplimit"), 255),
        ACCEPT,
    ]
    return {
        FORWARD_CHAIN: [vmap("ip", MAPS["fwd", 4]), vmap("ip6", MAPS["fwd", 6])],
        INPUT_CHAIN: [nd, vmap("ip", MAPS["in", 4]), vmap("ip6", MAPS["in", 6])],
    }


def _mark_is_set() -> dict:
    return _match({"&": [{"meta": {"key": "mark"}}, GUARD_MARK]}, GUARD_MARK)


def _mark_is_set_not() -> dict:
    return _match({"&": [{"meta": {"key": "mark"}}, GUARD_MARK]}, GUARD_MARK, op="!=")


_SET_MARK = {"mangle": {"key": {"meta": {"key": "mark"}}, "value": {"|": [{"meta": {"key": "mark"}}, GUARD_MARK]}}}


def guard_rule_exprs() -> list[list[dict]]:
    """The guard chain of one bridge (ingress hook, policy drop): only frames the bridge table
    marked as coming from a known agent on its own port go on to the forward and input hooks."""
    return [[_mark_is_set(), ACCEPT]]


def _binding(mac: dict, addr: dict, version: int) -> dict:
    """``iifname . <mac> . <addr> @bind4``: the frame's (ingress port, MAC, address) is a binding."""
    left = {"concat": [{"meta": {"key": "iifname"}}, mac, addr]}
    return _match(left, f"@{PORT_SETS[version]}")


def _untagged(ethertype: str) -> dict:
    """``ether type <ethertype>``: read at offset 12 of the frame as it arrived, so a frame with a
    VLAN tag (0x8100, 0x88a8, 0x9100, any depth) reads the tag's type here and never matches."""
    return _match(_payload("ether", "type"), ethertype)


#: ARP as the binding rule reads it: Ethernet/IPv4 addresses (so ``saddr ip`` is at its offset),
#: a request or a reply.
_ARP_SHAPE = [
    _match(_payload("arp", "htype"), 1),
    _match(_payload("arp", "ptype"), 0x0800),
    _match(_payload("arp", "hlen"), 6),
    _match(_payload("arp", "plen"), 4),
    _match(_payload("arp", "operation"), {"set": ["request", "reply"]}),
]


def bridge_rule_exprs() -> dict[str, list[list[dict]]]:
    """Rules of the bridge table's three base chains, by chain name: ``prerouting`` marks the frames of
    known agents (untagged IPv4, ARP or IPv6 matching a binding; for ARP the payload's sender too),
    ``port-guard`` drops every unmarked frame from a bound agent's port and unmarked ARP claiming an
    agent-subnet sender, and ``forward`` drops every frame bridged to or from an agent's port, subnet
    or MAC. Why each: docs/nft-isolation.md ("Layer 2").
    """
    nets = f"@{GUARD_NETS_SET}"
    ports = f"@{AGENT_PORTS_SET}"
    mac_mask = "ff:ff:ff:00:00:00"
    mac_prefix = AGENT_MAC_PREFIX + ":00:00:00"
    ether_saddr = _payload("ether", "saddr")
    ip6 = _match(_payload("ether", "type"), "ip6")
    arp_sender = _payload("arp", "saddr ip")
    return {
        BRIDGE_PREROUTING_CHAIN: [
            [_untagged("ip"), _binding(ether_saddr, _payload("ip", "saddr"), 4), _SET_MARK],
            [
                _untagged("arp"),
                *_ARP_SHAPE,
                _binding(ether_saddr, arp_sender, 4),
                _binding(_payload("arp", "saddr ether"), arp_sender, 4),
                _SET_MARK,
            ],
            [_untagged("ip6"), _binding(ether_saddr, _payload("ip6", "saddr"), 6), _SET_MARK],
        ],
        BRIDGE_PORT_GUARD_CHAIN: [
            [_match({"meta": {"key": "iifname"}}, ports), _mark_is_set_not(), DROP],
            [_match(arp_sender, nets), _mark_is_set_not(), DROP],
        ],
        BRIDGE_FORWARD_CHAIN: [
            [_match({"meta": {"key": "iifname"}}, ports), DROP],
            [_match({"meta": {"key": "oifname"}}, ports), DROP],
            [_match(_payload("ip", "saddr"), nets), DROP],
            [_match(_payload("ip", "daddr"), nets), DROP],
            [_match(_payload("arp", "saddr ip"), nets), DROP],
            [_match(_payload("arp", "daddr ip"), nets), DROP],
            [ip6, _match({"&": [_payload("ether", "saddr"), mac_mask]}, mac_prefix), DROP],
            [ip6, _match({"&": [_payload("ether", "daddr"), mac_mask]}, mac_prefix), DROP],
        ],
    }
