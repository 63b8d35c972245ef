"""What one agent's isolation rules depend on, validated before anything is rendered.

:class:`AgentSpec` (built with :meth:`AgentSpec.build`), the table-name and allowlist checks, and
:class:`RuleSpecError`, which names the field and the value.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from network.host_access import HostAccessEntry, HostAccessError, parse_host_access_entry

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}", re.ASCII)
_IFNAME = re.compile(r"[A-Za-z0-9_.\-]{1,15}", re.ASCII)
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", re.ASCII)


class RuleSpecError(ValueError):
    """Bad input to the renderer; the message names the field and the value."""


def validate_table_name(table: str) -> str:
    """Return ``table`` if it is a usable nft table name (letters, digits, ``_``, ``-``; ≤ 64).

    Raises :class:`RuleSpecError` naming the value otherwise.
    """
    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        raise RuleSpecError(
            f"nft table name {table!r} is not usable: use letters, digits, '_' or '-', starting with a "
            "letter or '_', at most 64 characters"
        )
    return table


def validate_ifname(name: object, what: str = "interface") -> str:
    """Return ``name`` if it is a Linux interface name (1-15 of A-Z a-z 0-9 _ . -); raises
    :class:`RuleSpecError` naming ``what`` and the value otherwise."""
    if not isinstance(name, str) or not _IFNAME.fullmatch(name):
        raise RuleSpecError(f"{what} {name!r} is not an interface name (1-15 of A-Z a-z 0-9 _ . -)")
    return name


def validate_mac(mac: object, what: str = "agent MAC") -> str:
    """``mac`` lower-cased if it is a unicast Ethernet address written ``aa:bb:cc:dd:ee:ff``;
    raises :class:`RuleSpecError` naming ``what`` and the value otherwise."""
    text = mac.lower() if isinstance(mac, str) else None
    if text is None or not _MAC.fullmatch(text) or int(text[:2], 16) & 1:
        raise RuleSpecError(f"{what} {mac!r} is not a unicast MAC address (aa:bb:cc:dd:ee:ff)")
    return text


def parse_allowlist_entry(text: str) -> IPNetwork:
    """One ``networkPolicy.allowlist`` entry: an IPv4/IPv6 address or CIDR (no brackets, no port).

    Returns the network (a single address becomes /32 or /128). Raises :class:`RuleSpecError`
    naming the entry for anything else, including CIDRs with host bits set (``10.1.0.5/16``),
    which would otherwise be silently widened or narrowed.
    """
    if not isinstance(text, str):
        raise RuleSpecError(f"allowlist entry {text!r} must be a string, not {type(text).__name__}")
    value = text.strip()
    try:
        loose = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise RuleSpecError(
            f'allowlist entry "{text}" is not an IPv4/IPv6 address or CIDR (hostnames and ports are not accepted)'
        ) from None
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise RuleSpecError(
            f'allowlist entry "{text}" has host bits set: write "{loose}" for the network or '
            f'"{value.split("/")[0]}" for the one address'
        ) from None
    return net


@dataclass(frozen=True)
class AgentSpec:
    """Everything the rules for one agent depend on, already validated (build with :meth:`build`).
    ``address``: its source address, the key of its map elements; ``gateway``: accepted on forward;
    ``allowlist``: networks accepted ahead of the private-range drops, in order; ``deny_all``: drop
    everything else on forward; ``host_access``: the resolved entries, on input in order; ``port`` and
    ``mac`` (lower case): its bridge port and MAC, bound with the address for the guard (None: no
    binding, so a guarded bridge passes nothing from it).
    """

    address: IPAddress
    gateway: IPAddress
    allowlist: tuple[IPNetwork, ...] = ()
    deny_all: bool = False
    host_access: tuple[HostAccessEntry, ...] = field(default=())
    port: str | None = None
    mac: str | None = None

    @classmethod
    def build(
        cls,
        address: str,
        gateway: str,
        allowlist: Iterable[str] = (),
        deny_all: bool = False,
        host_access: Iterable[str] = (),
        port: str | None = None,
        mac: str | None = None,
    ) -> AgentSpec:
        """Validate and build a spec from strings; raises :class:`RuleSpecError` naming the field.

        ``host_access`` entries are parsed with ``parse_host_access_entry``; a bad one raises
        ``RuleSpecError`` carrying its message, so nothing is rendered from a list with one bad entry.
        ``port`` and ``mac`` come together: a binding without the MAC would let the port send
        frames from any MAC.
        """
        try:
            addr = ipaddress.ip_address(str(address).strip())
        except ValueError:
            raise RuleSpecError(f"agent address {address!r} is not an IPv4 or IPv6 address") from None
        try:
            gw = ipaddress.ip_address(str(gateway).strip())
        except ValueError:
            raise RuleSpecError(f"gateway {gateway!r} is not an IPv4 or IPv6 address") from None
        if isinstance(allowlist, str):
            raise RuleSpecError(f"allowlist must be a list of addresses, not the string {allowlist!r}")
        if isinstance(host_access, str):
            raise RuleSpecError(f"hostAccess must be a list of entries, not the string {host_access!r}")
        nets = tuple(parse_allowlist_entry(e) for e in allowlist)
        entries = []
        for index, text in enumerate(host_access):
            try:
                entries.append(parse_host_access_entry(text))
            except HostAccessError as exc:
                raise RuleSpecError(f"hostAccess[{index}]: {exc}") from None
        if not isinstance(deny_all, bool):
            raise RuleSpecError(f"denyAll must be true or false, not {deny_all!r}")
        if port is not None:
            validate_ifname(port, "agent port")
            if mac is None:
                raise RuleSpecError(f"agent port {port!r} needs the agent's MAC on it")
            mac = validate_mac(mac)
        elif mac is not None:
            raise RuleSpecError(f"agent MAC {mac!r} needs its port")
        return cls(
            address=addr, gateway=gw, allowlist=nets, deny_all=deny_all, host_access=tuple(entries), port=port, mac=mac
        )
