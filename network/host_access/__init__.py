"""What a scaled agent may reach on the console host's own addresses (SPEC g; seed host-access.d.ts).

A sandbox's packets to one of the host's addresses (the bridge gateway, the host's LAN address) are
delivered on the netfilter *input* hook and never cross *forward*, so forward rules alone leave every
host port open. The entries here are the narrow set an agent may reach, in the ``hostAccess``
vocabulary an operator writes in ``scalers.yaml``; ``network.nft.render`` turns them into input rules.

Grammar (SPEC g.1, plus bracketed IPv6 beyond the reference)::

    5000                 port 5000 on any IPv4 host address
    *:5000               same
    10.0.0.1:5000        one address, one port
    10.98.0.0/24:443     a CIDR, one port
    192.168.1.40         one address, every port and protocol
    10.0.0.0/8           a CIDR, every port
    *                    the whole host (IPv4)
    10.0.0.1:*           same as ``10.0.0.1``
    [fd00::1]:9000       IPv6 address, one port
    [fd00::/64]:443      IPv6 CIDR, one port
    [fd00::1]            IPv6 address, every port

Refused, each with a message naming the entry: empty entries, an empty address before the port
(``:53``: write ``*:53`` or ``53``), hostnames, dotted numbers that are not a valid IPv4 address or
CIDR (``192.168.1.256``: octet 256 is above 255; also leading zeros, three or five parts, prefix
above 32), unbracketed IPv6, CIDRs with host bits set (``10.0.0.1/24``: ambiguous, say
``10.0.0.0/24`` or ``10.0.0.1``), ports outside 1-65535, non-numeric ports.

Accepted but warned about (:func:`host_access_warnings`, never blocking): loopback entries
(``127.0.0.1:5432``, ``[::1]``), which agents cannot reach.

Wildcard entries (``*``, ``*:port``, a bare port) cover IPv4 host addresses only: IPv6 is reachable
only through an explicit bracketed entry, so moving the rules to an ``inet`` table did not silently
widen what ``*:4000`` meant in the reference's IPv4-only table.
"""

from .grammar import (
    Family,
    HostAccessEntry,
    HostAccessError,
    IPNetwork,
    describe_host_access_entry,
    host_access_warnings,
    parse_host_access,
    parse_host_access_entry,
)
from .resolve import SCHEME_PORTS, agent_facing_storage_url, resolve_agent_host_access, storage_host_access_entries

__all__ = [
    "SCHEME_PORTS",
    "Family",
    "HostAccessEntry",
    "HostAccessError",
    "IPNetwork",
    "agent_facing_storage_url",
    "describe_host_access_entry",
    "host_access_warnings",
    "parse_host_access",
    "parse_host_access_entry",
    "resolve_agent_host_access",
    "storage_host_access_entries",
]
