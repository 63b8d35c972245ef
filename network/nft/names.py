"""Names in a console's nft table: the table's objects and an agent's chains, read both ways.

Ownership is read from names: chain ``a4-172-30-0-5-fwd`` belongs to agent 172.30.0.5 (see
:mod:`network.nft.render`).
"""

from __future__ import annotations

import ipaddress
import re

from .spec import IPAddress

FAMILY = "inet"
FORWARD_CHAIN = "forward"
INPUT_CHAIN = "input"
GUARD_SET = "guard_ifaces"
PRIVATE_SET = "private4"
MAPS = {
    ("fwd", 4): "agents4_fwd",
    ("fwd", 6): "agents6_fwd",
    ("in", 4): "agents4_in",
    ("in", 6): "agents6_in",
}
MAP_TYPES = {4: "ipv4_addr", 6: "ipv6_addr"}

_CHAIN_NAME = re.compile(r"a([46])-([0-9a-f.\-]+)-(fwd|in)", re.ASCII)


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
