"""Names in a console's nft tables: the objects of its ``inet`` and ``bridge`` tables, the guard and
policy chains, read both ways.

An agent is an address in the verdict maps (``agents4_fwd`` …) or the port sets; its elements jump to
policy chains ``pol-fwd-<digest>`` / ``pol-in-<digest>`` that every agent with the same rules shares.
Chain ``guard-kici-br0`` guards bridge ``kici-br0`` (see :mod:`network.nft.render`).
"""

from __future__ import annotations

import hashlib
import json
import re

FAMILY = "inet"
FORWARD_CHAIN = "forward"
INPUT_CHAIN = "input"
#: The console's agent gateway: its own input chain (before the agents' policies) capping the
#: connections one source may hold, with the dynamic sets of sources it counts per family.
GATEWAY_CHAIN = "gateway"
GATEWAY_PRIORITY = -10
GATEWAY_CONNS_SETS = {4: "gateway_conns4", 6: "gateway_conns6"}
PRIVATE_SET = "private4"
#: The host's own connected subnets by IP version (interval sets, refilled from the host's
#: addresses whenever the base is written): dropped on forward like the private ranges.
HOST_NETS_SETS = {4: "hostnets4", 6: "hostnets6"}

#: The console's second table, same name, family ``bridge``: binds agents to their ports.
BRIDGE_FAMILY = "bridge"
BRIDGE_PREROUTING_CHAIN = "prerouting"
BRIDGE_FORWARD_CHAIN = "forward"
#: Drops every frame from a bound agent's port that no table marked (layer 2: tagged frames, other
#: ethertypes, a foreign MAC or address) and unmarked ARP from an agent subnet.
BRIDGE_PORT_GUARD_CHAIN = "port-guard"
#: The console's third table, same name, family ``netdev``: one ingress guard per bridge that,
#: unlike the ``inet`` guard, sees every ethertype going up to the host (ARP, tagged frames).
NETDEV_FAMILY = "netdev"
#: ``ifname . ether_addr . ipv4_addr`` / ``... ipv6_addr``: the (port, MAC, address) bindings of
#: known agents.
PORT_SETS = {4: "bind4", 6: "bind6"}
PORT_SET_TYPES = {4: ["ifname", "ether_addr", "ipv4_addr"], 6: ["ifname", "ether_addr", "ipv6_addr"]}
#: The agent subnets (interval set): never bridged from one port to another.
GUARD_NETS_SET = "guard_nets4"
#: The ports of bound agents (``ifname``), written and removed with their bindings: nothing
#: unmarked leaves them, and nothing is bridged to or from them.
AGENT_PORTS_SET = "agent_ports"
#: The mark bit the bridge table sets on frames from a known agent on its own port; every guard
#: chain drops what arrives from its bridge without it. One bit, OR-ed in: other users of the mark
#: keep theirs, and every console on the host sets and tests the same bit.
GUARD_MARK = 0x00100000
#: MAC prefix of agent containers (locally administered): IPv6 frames to or from it are never
#: bridged port to port, whatever their addresses.
AGENT_MAC_PREFIX = "02:4b:43"
GUARD_CHAIN_PREFIX = "guard-"
MAPS = {
    ("fwd", 4): "agents4_fwd",
    ("fwd", 6): "agents6_fwd",
    ("in", 4): "agents4_in",
    ("in", 6): "agents6_in",
}
MAP_TYPES = {4: "ipv4_addr", 6: "ipv6_addr"}

#: Policy chain name prefixes by kind: forward (what the agent may reach) and input (host access).
POLICY_CHAIN_PREFIXES = {"fwd": "pol-fwd-", "in": "pol-in-"}
_POLICY_DIGEST = re.compile(r"[0-9a-f]{16}", re.ASCII)


def guard_chain_name(ifname: str) -> str:
    """``guard-kici-br0``: the ingress chain guarding bridge ``kici-br0``."""
    return GUARD_CHAIN_PREFIX + ifname


def parse_guard_chain_name(name: str) -> str | None:
    """The bridge a guard chain guards (``guard-kici-br0`` → ``kici-br0``), else None."""
    if name.startswith(GUARD_CHAIN_PREFIX) and len(name) > len(GUARD_CHAIN_PREFIX):
        return name[len(GUARD_CHAIN_PREFIX) :]
    return None


def policy_chain_name(kind: str, rules: list[list[dict]]) -> str:
    """``pol-fwd-<digest>`` / ``pol-in-<digest>``: the chain holding ``rules`` for agents of that
    policy. The digest (16 hex digits of SHA-256 over the rules' canonical JSON) names the content,
    so agents with equal rules share one chain and a chain's name says what it must hold.
    Raises KeyError for a ``kind`` other than ``"fwd"`` / ``"in"``."""
    body = json.dumps(rules, sort_keys=True, separators=(",", ":")).encode()
    return POLICY_CHAIN_PREFIXES[kind] + hashlib.sha256(body).hexdigest()[:16]


def parse_policy_chain_name(name: str) -> str | None:
    """The kind (``"fwd"`` / ``"in"``) of a policy chain name, else None."""
    for kind, prefix in POLICY_CHAIN_PREFIXES.items():
        if _POLICY_DIGEST.fullmatch(name[len(prefix) :]) and name.startswith(prefix):
            return kind
    return None
