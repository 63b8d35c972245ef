"""Names in a console's nft tables: the objects of its ``inet`` and ``bridge`` tables and an agent's
chains, read both ways.

Ownership is read from names: chain ``a4-172-30-0-5-fwd`` belongs to agent 172.30.0.5, chain
``guard-kici-br0`` guards bridge ``kici-br0`` (see :mod:`network.nft.render`).
"""

from __future__ import annotations

import ipaddress
import re

from .spec import IPAddress

FAMILY = "inet"
FORWARD_CHAIN = "forward"
INPUT_CHAIN = "input"
PRIVATE_SET = "private4"

#: The console's second table, same name, family ``bridge``: binds agents to their ports.
BRIDGE_FAMILY = "bridge"
BRIDGE_PREROUTING_CHAIN = "prerouting"
BRIDGE_FORWARD_CHAIN = "forward"
#: Drops ARP from an agent subnet that no table marked: the inet guard sees only IPv4 and IPv6.
BRIDGE_ARP_CHAIN = "arp-guard"
#: ``ifname . ipv4_addr`` / ``ifname . ipv6_addr``: the (port, address) pairs of known agents.
PORT_SETS = {4: "ports4", 6: "ports6"}
PORT_SET_TYPES = {4: ["ifname", "ipv4_addr"], 6: ["ifname", "ipv6_addr"]}
#: The agent subnets (interval set): never bridged from one port to another.
GUARD_NETS_SET = "guard_nets4"
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

_CHAIN_NAME = re.compile(r"a([46])-([0-9a-f.\-]+)-(fwd|in)", re.ASCII)


def guard_chain_name(ifname: str) -> str:
    """``guard-kici-br0``: the ingress chain guarding bridge ``kici-br0``."""
    return GUARD_CHAIN_PREFIX + ifname


def parse_guard_chain_name(name: str) -> str | None:
    """The bridge a guard chain guards (``guard-kici-br0`` → ``kici-br0``), else None."""
    if name.startswith(GUARD_CHAIN_PREFIX) and len(name) > len(GUARD_CHAIN_PREFIX):
        return name[len(GUARD_CHAIN_PREFIX) :]
    return None


def agent_key(address: IPAddress | str) -> str:
    """``a4-172-30-0-5`` / ``a6-fd00--5``: the name stem of an agent's chains (reversible)."""
    addr = ipaddress.ip_address(address) if isinstance(address, str) else address
    if addr.version == 4:
        return "a4-" + str(addr).replace(".", "-")
    return "a6-" + str(addr).replace(":", "-")


def agent_chain_names(address: IPAddress | str) -> tuple[str, str]:
    """(forward chain, input chain) names for an agent address."""
    key = agent_key(address)
    return f"{key}-fwd", f"{key}-in"


def parse_chain_name(name: str) -> tuple[IPAddress, str] | None:
    """``("a4-172-30-0-5-fwd")`` → ``(IPv4Address('172.30.0.5'), "fwd")``; not an agent chain → None."""
    match = _CHAIN_NAME.fullmatch(name)
    if match is None:
        return None
    version, body, kind = match.groups()
    text = body.replace("-", "." if version == "4" else ":")
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if addr.version != int(version) or agent_key(addr) + f"-{kind}" != name:
        return None
    return addr, kind
