"""What a scaled agent may reach on the console host's own addresses: the ``hostAccess`` entry
grammar (parsing, refusal messages, warnings) and the resolution of one agent's host access (the
default set and the storage endpoint). The grammar, what is refused and what is warned about:
docs/nft-isolation.md ("Host access entries")."""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from lib.wording import json_text

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Family = Literal["ipv4", "ipv6"]

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
#: A negative port (``-1``): a number, out of range.
_NEGATIVE = re.compile(r"-[0-9]+", re.ASCII)
#: A port with a protocol after it (``4000/tcp``).
_PORT_PROTOCOL = re.compile(r"([0-9]+)/(?:tcp|udp)", re.ASCII | re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")
_DOTTED_QUAD = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})", re.ASCII)
#: Digits and dots, maybe with a ``/prefix``: written as an IPv4 address or CIDR, not as a name.
_IPV4_SHAPED = re.compile(r"[0-9.]+(?:/[^/]*)?", re.ASCII)

_NOT_AN_ADDRESS = (
    'which is not an IPv4 address, an IPv4 CIDR, or "*". Hostnames are not accepted: a firewall '
    "rule needs an address, and a name can resolve to a different one later. IPv6 addresses go in "
    'brackets, e.g. "[fd00::1]:9000".'
)


class HostAccessError(ValueError):
    """A ``hostAccess`` entry that does not parse; ``entry`` is the raw text, ``reason`` why."""

    def __init__(self, entry: object, message: str):
        super().__init__(message)
        self.entry = entry


@dataclass(frozen=True)
class HostAccessEntry:
    """One parsed ``hostAccess`` entry.

    ``daddr``: the host address or network the entry allows, or ``None`` for any IPv4 host
    address (``*``, ``*:port``, a bare port). A single address is a /32 (or /128) network.
    ``port``: 1-65535, or ``None`` for every port and protocol. With a port, the entry allows that
    port on TCP and on UDP. ``family``: ``"ipv4"`` (addresses, CIDRs and wildcards) or ``"ipv6"``
    (bracketed entries only). ``text``: the entry as written (trimmed).
    """

    text: str
    daddr: IPNetwork | None
    port: int | None
    family: Family

    @property
    def canonical(self) -> str:
        """The entry in normal form: ``*:4000``, ``10.0.0.1:53``, ``[fd00::/64]:443``, ``*``."""
        if self.daddr is None:
            addr = "*"
        else:
            single = self.daddr.prefixlen == self.daddr.max_prefixlen
            addr = str(self.daddr.network_address) if single else str(self.daddr)
            if self.family == "ipv6":
                addr = f"[{addr}]"
        return addr if self.port is None else f"{addr}:{self.port}"


#: Characters in one entry, at most.
MAX_ENTRY_LENGTH = 64


def _quote(text: object) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parse_port(entry: str, text: str | None) -> int | None:
    """Port part of an entry: ``None``/``*`` mean every port; otherwise 1-65535.

    A negative number is a port out of range, not "not a number"; ``4000/tcp`` is told that an
    entry opens TCP and UDP alike.
    """
    if text is None or text == "*":
        return None
    if text == "":
        raise HostAccessError(
            entry,
            f'hostAccess entry {_quote(entry)} has no port after the ":": write a port 1-65535 or "*", '
            'or leave out the ":" for every port',
        )
    if _NEGATIVE.fullmatch(text):
        raise HostAccessError(entry, f"hostAccess entry {_quote(entry)} has port {text}, outside 1-65535")
    protocol = _PORT_PROTOCOL.fullmatch(text)
    if protocol:
        raise HostAccessError(
            entry,
            f"hostAccess entry {_quote(entry)} names a protocol after port {protocol[1]}: an entry opens its "
            f'port on TCP and UDP alike, write "{entry[: -len(text)]}{protocol[1]}"',
        )
    if not _DIGITS.fullmatch(text):
        raise HostAccessError(
            entry, f"hostAccess entry {_quote(entry)} has port {_quote(text)}: a port is written as digits, 1-65535"
        )
    port = int(text)
    if not 1 <= port <= 65535:
        raise HostAccessError(entry, f"hostAccess entry {_quote(entry)} has port {text}, outside 1-65535")
    if text.startswith("0"):  # as an octet's: the entry is kept as written, so it must read as it means
        raise HostAccessError(
            entry, f"hostAccess entry {_quote(entry)} has port {_quote(text)} with a leading zero: write {port}"
        )
    return port


def _host_bits_error(entry: str, net_text: str, version: int) -> HostAccessError:
    net = ipaddress.ip_network(net_text, strict=False)
    addr = net_text.split("/")[0]
    if version == 6:
        hint = f'"[{net}]" for the network or "[{addr}]" for the one address'
    else:
        hint = f'"{net}" for the network or "{addr}" for the one address'
    return HostAccessError(
        entry,
        f"hostAccess entry {_quote(entry)} has CIDR {_quote(net_text)} with host bits set, which is "
        f"ambiguous: write {hint}",
    )


def _ipv4_problem(text: str) -> str | None:
    """Why ``text`` (digits and dots, maybe ``/prefix``: written as an IPv4 address or CIDR) is not
    a valid one, in words (``octet 256 is above 255``); None when it is valid."""
    addr, slash, prefix = text.partition("/")
    parts = addr.split(".")
    if len(parts) != 4:
        return f"it has {len(parts)} dot-separated part{'s' if len(parts) != 1 else ''}, an IPv4 address has 4"
    for part in parts:
        if part == "":
            return "one of its four octets is empty"
        if not _DIGITS.fullmatch(part):
            return f"octet {_quote(part)} is not a number"
        if len(part) > 1 and part[0] == "0":
            return f"octet {_quote(part)} has a leading zero (octal or decimal? write it without)"
        if int(part) > 255:
            return f"octet {part} is above 255"
    if slash:
        if not _DIGITS.fullmatch(prefix):
            return f'the prefix after "/" is {_quote(prefix)}, not a number 0-32'
        if len(prefix) > 1 and prefix[0] == "0":
            return f"prefix /{prefix} has a leading zero"
        if int(prefix) > 32:
            return f"prefix /{prefix} is above 32"
    return None


def _parse_ipv4(entry: str, text: str) -> ipaddress.IPv4Network:
    """An IPv4 address or CIDR (octets 0-255 without leading zeros, prefix 0-32, no host bits).

    Text made only of digits and dots (and a ``/prefix``) was meant as an address, so it is refused
    saying what is wrong with it (``192.168.1.256``: octet 256 is above 255); anything else (letters,
    ``-``) is a hostname and is refused as one.
    """
    if _IPV4_SHAPED.fullmatch(text):
        problem = _ipv4_problem(text)
        if problem is not None:
            kind = "CIDR" if "/" in text else "address"
            raise HostAccessError(
                entry,
                f"hostAccess entry {_quote(entry)} names {_quote(text)}, which is not a valid IPv4 {kind}: {problem}",
            )
    else:
        raise HostAccessError(entry, f"hostAccess entry {_quote(entry)} names {_quote(text)}, {_NOT_AN_ADDRESS}")
    try:
        return ipaddress.IPv4Network(text, strict=True)
    except ValueError:
        raise _host_bits_error(entry, text, 4) from None


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Network(text, strict=False)
    except ValueError:
        return False
    return True


def _zone_error(entry: str) -> HostAccessError:
    return HostAccessError(
        entry, f"hostAccess entry {_quote(entry)} has a zone index; scoped IPv6 addresses are not accepted"
    )


def _unbracketed_ipv6_error(entry: str) -> HostAccessError | None:
    """The error for an entry that is (or starts with) an IPv6 address or CIDR written without
    brackets, with the bracketed form to write; None for any other entry.

    IPv6 entries are accepted in brackets only: without them the last ``:`` may belong to the
    address or start a port (``fd00::1:9000``), so when both readings hold, both are offered.
    """
    if entry.count(":") < 2:
        return None
    head, _, tail = entry.rpartition(":")
    whole, split = _is_ipv6(entry), _is_ipv6(head)
    if not (whole or split):
        return None
    if "%" in entry:
        return _zone_error(entry)
    if whole:
        kind = "CIDR" if "/" in entry else "address"
        fix = f'write "[{entry}]"'
        if split and _DIGITS.fullmatch(tail):
            fix += f' for that {kind}, or "[{head}]:{tail}" for port {tail} on {head}'
        return HostAccessError(entry, f"hostAccess entry {_quote(entry)} is an IPv6 {kind} without brackets: {fix}")
    return HostAccessError(
        entry,
        f"hostAccess entry {_quote(entry)} starts with IPv6 {'CIDR' if '/' in head else 'address'} {head} "
        f'without brackets: write "[{head}]:<port>", or "[{head}]" for every port',
    )


def _whitespace_error(entry: str) -> HostAccessError:
    """The error for an entry with whitespace inside it, offering the entry without it when that
    parses and no space stood between two letters or digits (``127.0.0.1 :8000`` →
    ``127.0.0.1:8000``; ``5 3`` could be 5, 3 or 53, so nothing is offered)."""
    joined = "".join(entry.split())
    between_words = any(
        entry[m.start() - 1].isalnum() and entry[m.end()].isalnum() for m in _WHITESPACE.finditer(entry)
    )
    hint = "an entry is written without spaces"
    if not between_words:
        try:
            parse_host_access_entry(joined)
            hint = f'did you mean "{joined}"?'
        except HostAccessError:
            pass
    return HostAccessError(entry, f"hostAccess entry {_quote(entry)} has whitespace inside it: {hint}")


def _parse_bracketed(entry: str) -> HostAccessEntry:
    close = entry.find("]")
    if close < 0:
        raise HostAccessError(entry, f"hostAccess entry {_quote(entry)} opens a bracket but never closes it")
    inner, rest = entry[1:close], entry[close + 1 :]
    if rest == "":
        port_text = None
    elif rest.startswith(":"):
        port_text = rest[1:]
    else:
        raise HostAccessError(
            entry, f"hostAccess entry {_quote(entry)} has {_quote(rest)} after the bracket; expected nothing or :port"
        )
    if "%" in inner:
        raise _zone_error(entry)
    if _IPV4_SHAPED.fullmatch(inner) and _ipv4_problem(inner) is None:
        raise HostAccessError(
            entry,
            f"hostAccess entry {_quote(entry)} has IPv4 {'CIDR' if '/' in inner else 'address'} {inner} in "
            f'brackets, which are for IPv6: write "{inner}{rest}"',
        )
    try:
        ipaddress.IPv6Network(inner, strict=False)
        if "/" in inner:
            prefix = inner.split("/", 1)[1]
            if not _DIGITS.fullmatch(prefix) or (len(prefix) > 1 and prefix[0] == "0"):
                raise ValueError(prefix)
    except ValueError:
        raise HostAccessError(
            entry,
            f"hostAccess entry {_quote(entry)} has {_quote(inner)} in brackets, which is not an IPv6 address "
            "or IPv6 CIDR",
        ) from None
    try:
        net = ipaddress.IPv6Network(inner, strict=True)
    except ValueError:
        raise _host_bits_error(entry, inner, 6) from None
    return HostAccessEntry(text=entry, daddr=net, port=_parse_port(entry, port_text), family="ipv6")


def parse_host_access_entry(text: str) -> HostAccessEntry:
    """Parse one ``hostAccess`` entry (whitespace around it trimmed) into a :class:`HostAccessEntry`.
    Raises :class:`HostAccessError` (a ``ValueError``, also for a non-string) naming the entry and the
    reason, e.g. ``... which is not a valid IPv4 address: octet 256 is above 255``; the grammar and
    every refusal: docs/nft-isolation.md ("Host access entries").
    """
    if not isinstance(text, str):
        raise HostAccessError(text, f"hostAccess entry must be a string, got {json_text(text)}")
    entry = text.strip()
    if entry == "":
        raise HostAccessError(text, f"hostAccess entry is empty (got {_quote(text)})")
    if len(entry) > MAX_ENTRY_LENGTH:
        # The longest valid entry ("[v6 address/128]:65535") is 51 characters; a longer one is
        # refused whole, before any part is read as a number.
        raise HostAccessError(
            entry,
            f"hostAccess entry {_quote(entry[:40] + '…')} is {len(entry)} characters long; "
            f"an entry is at most {MAX_ENTRY_LENGTH}",
        )
    if any(c.isspace() for c in entry):
        raise _whitespace_error(entry)
    if _DIGITS.fullmatch(entry) or _NEGATIVE.fullmatch(entry) or _PORT_PROTOCOL.fullmatch(entry):
        # A bare port, written wrong or right.
        return HostAccessEntry(text=entry, daddr=None, port=_parse_port(entry, entry), family="ipv4")
    if entry.startswith("["):
        return _parse_bracketed(entry)
    if error := _unbracketed_ipv6_error(entry):
        raise error
    if ":" in entry:
        addr_text, port_text = entry.rsplit(":", 1)
    else:
        addr_text, port_text = entry, None
    if ":" in addr_text:
        raise HostAccessError(
            entry,
            f'hostAccess entry {_quote(entry)} has more than one ":": an IPv4 entry is address:port, and '
            'IPv6 addresses go in brackets, e.g. "[fd00::1]:9000"',
        )
    if addr_text == "":
        if port_text is not None and _DIGITS.fullmatch(port_text):
            hint = f'write "*:{port_text}" (or just "{port_text}") for port {port_text} on any IPv4 host address'
        else:
            hint = 'write an IPv4 address, an IPv4 CIDR or "*" before the ":"'
        raise HostAccessError(entry, f'hostAccess entry {_quote(entry)} has no address before the ":": {hint}')
    if addr_text == "*":
        daddr = None
    else:
        daddr = _parse_ipv4(entry, addr_text)
    return HostAccessEntry(text=entry, daddr=daddr, port=_parse_port(entry, port_text), family="ipv4")


_LOOPBACK4 = ipaddress.IPv4Network("127.0.0.0/8")
_UNSPECIFIED4 = ipaddress.IPv4Network("0.0.0.0/32")
_LOOPBACK6 = ipaddress.IPv6Network("::1/128")


HostAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: The kernel's TCP socket tables and the state number of a listening socket in them.
_PROC_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN = "0A"


#: Where this host's TCP sockets listen: port → the addresses (``0.0.0.0``/``::`` for a wildcard).
Listening = Mapping[int, tuple[HostAddress, ...]]


def tcp_listening(tables: Iterable[str] | None = None) -> dict[int, tuple[HostAddress, ...]] | None:
    """Every listening TCP socket of this host's network namespace, by port, read once from the
    kernel's ``tables`` (default ``/proc/net/tcp`` and ``tcp6``), in table order; None when none
    can be read (another namespace or a host with no procfs: nothing is known). Read it once per
    check and hand it to whatever needs it (:func:`host_access_warnings`, the console's services)."""
    found: dict[int, list[HostAddress]] = {}
    read_any = False
    for path in _PROC_TCP if tables is None else tables:
        try:
            with open(path) as table:
                lines = table.readlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _TCP_LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            # The kernel prints each 32-bit word of the address as a number in host byte order.
            words = [bytes.fromhex(address[i : i + 8]) for i in range(0, len(address), 8)]
            ip = ipaddress.ip_address(b"".join(w[::-1] if sys.byteorder == "little" else w for w in words))
            mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
            found.setdefault(int(hex_port, 16), []).append(mapped or ip)
    return {port: tuple(addresses) for port, addresses in found.items()} if read_any else None


@dataclass(frozen=True)
class ConsoleService:
    """One of the console's own backing services, which no agent may reach: ``name`` for the
    message (``PostgreSQL (DATABASE_URL)``), ``host`` as configured (an address, a wildcard such as
    ``0.0.0.0``, or a name) and ``port``. ``exact``: ``host`` is where the service listens (the
    console's own listeners), so a loopback one is out of the agents' reach; otherwise ``host`` is
    only where the console dials it, and the service may listen on every host address too, unless
    ``listeners`` (where this host's sockets listen on ``port``, when known: :func:`tcp_listening`)
    are all loopback addresses."""

    name: str
    host: str
    port: int
    exact: bool = False
    listeners: tuple[HostAddress, ...] = ()

    def opened_by(self, entry: HostAccessEntry) -> bool:
        """Whether ``entry`` opens this service's port on an address it may listen on: the port
        matches (or the entry has none) and the entry covers the service's address. A wildcard or
        named host, and a loopback one that is not ``exact``, may listen on every host address of
        its family, so any such address matches it."""
        if entry.port not in (None, self.port):
            return False
        if self.listeners and all(a.is_loopback for a in self.listeners):
            return False  # the agents' packets never reach a loopback socket
        try:
            address = ipaddress.ip_address(self.host.strip("[]"))
        except ValueError:
            return True  # a name: it may resolve to any of the host's addresses
        if address.is_unspecified:
            return True
        if address.is_loopback:
            if self.exact:
                return False
            return (4 if entry.daddr is None else entry.daddr.version) == address.version
        if entry.daddr is None:
            return address.version == 4
        return address in entry.daddr

    def described(self, entry: HostAccessEntry, gateway: HostAddress | None) -> str:
        """This service as a warning names it: where the console has it, where this host's sockets
        listen for it (when known and not all loopback), and where agents would reach it: the
        agents' ``gateway`` (the address agents dial the host on) when ``entry`` covers it and the
        service may listen there ("to the agents at 172.30.0.1:5432")."""
        text = f"{self.name} on {self.host}:{self.port}"
        shown = [a for a in self.listeners if not a.is_loopback]
        if shown:
            text += ", listening on " + ", ".join(f"{_bracketed(str(a))}:{self.port}" for a in shown)
        if gateway is not None and _covers(entry, gateway) and self.opened_by(_gateway_entry(gateway, self.port)):
            return f"{text}, to the agents at {_bracketed(str(gateway))}:{self.port}"
        return f"{text}, to the agents"


def _covers(entry: HostAccessEntry, address: HostAddress) -> bool:
    """Whether ``entry``'s address part holds ``address`` (a wildcard holds every IPv4 one)."""
    return address.version == 4 if entry.daddr is None else address in entry.daddr


def _gateway_entry(gateway: HostAddress, port: int | None) -> HostAccessEntry:
    """The entry opening ``port`` (every port for None) on ``gateway`` alone."""
    net = ipaddress.ip_network(gateway)
    text = f"{_bracketed(str(gateway))}" + ("" if port is None else f":{port}")
    return HostAccessEntry(text=text, daddr=net, port=port, family="ipv4" if gateway.version == 4 else "ipv6")


#: Listening ports a warning names, at most; the others are counted.
_EXPOSED_SHOWN = 12


def _every_address(net: IPNetwork | None) -> str:
    """Where a port-less entry opens every port, in a warning's words."""
    if net is None or net.prefixlen == 0:
        return "every address of this host"
    if net.num_addresses == 1:
        return f"this host's address {net.network_address}"
    return f"every address in {net}"


def _exposed_ports(entry: HostAccessEntry, listening: Listening | None) -> str:
    """``" (listening there now: 22 on 0.0.0.0, 8000 on 172.30.0.1)"``: the ports this host's
    sockets listen on (``listening``) at an address ``entry`` covers, a wildcard of its family
    included; loopback sockets are out of the agents' reach. Empty when ``listening`` is not
    known or holds none; more than :data:`_EXPOSED_SHOWN` ports are counted, not named."""
    version = 4 if entry.daddr is None else entry.daddr.version
    found: list[str] = []
    for port, addresses in sorted((listening or {}).items()):
        reached = [
            a
            for a in addresses
            if a.version == version and not a.is_loopback and (a.is_unspecified or _covers(entry, a))
        ]
        found.extend(f"{port} on {_bracketed(str(a))}" for a in dict.fromkeys(reached))
    if not found:
        return ""
    more = f" and {len(found) - _EXPOSED_SHOWN} more" if len(found) > _EXPOSED_SHOWN else ""
    return f" (listening there now: {', '.join(found[:_EXPOSED_SHOWN])}{more})"


def host_access_warnings(
    entries: Iterable[str | HostAccessEntry],
    host_addresses: Iterable[HostAddress] | None = None,
    services: Iterable[ConsoleService] = (),
    *,
    gateway: HostAddress | None = None,
    listening: Listening | None = None,
) -> list[str]:
    """Non-fatal remarks on a ``hostAccess`` list: entries that parse but cannot do what they seem
    to (loopback, no host address, several host addresses, the console's own services, every port;
    each kind and why: docs/nft-isolation.md, "Host access entries"). ``host_addresses`` (this
    host's addresses and the agents' gateway) enables the address checks. Entries that do not parse
    are skipped (the parser reports them). Returns at most one message per entry, naming it, in
    list order.
    """
    known = None
    if host_addresses is not None:
        known = sorted({a for a in host_addresses if not a.is_loopback}, key=lambda a: (a.version, a))
    services = list(services)
    warnings = []
    for item in entries:
        try:
            entry = item if isinstance(item, HostAccessEntry) else parse_host_access_entry(item)
        except HostAccessError:
            continue
        net = entry.daddr
        if net is not None and (net.subnet_of(_LOOPBACK4) if net.version == 4 else net.subnet_of(_LOOPBACK6)):
            where = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
            warnings.append(
                f"hostAccess entry {_quote(entry.text)} names the host's loopback ({where}): agents cannot reach "
                "the host's loopback, their packets arrive on the agents' bridge, so this entry opens nothing. "
                "Make the service listen on the bridge gateway address and allow that instead."
            )
            continue
        covered = None if known is None or net is None else [a for a in known if a in net]
        if covered == [] and net is not None:
            # The host's addresses of the entry's family: an IPv4 entry is not told of link-local IPv6.
            listed = ", ".join(str(a) for a in known or () if a.version == net.version) or "none"
            every = ""
            if net == _UNSPECIFIED4 and entry.port:  # "0.0.0.0:port" read as a listen address
                every = f' For port {entry.port} on every host IPv4 address, write "*:{entry.port}".'
            warnings.append(
                f"hostAccess entry {_quote(entry.text)} holds none of this host's addresses ({listed}), so this "
                "entry opens nothing: host access opens ports on the host's own addresses only. What agents may "
                f"reach on other machines is the label set's networkPolicy allowlist.{every}"
            )
            continue
        example = f' (e.g. "{_gateway_entry(gateway, 53).text}")' if gateway is not None else ""
        opened = [s for s in services if s.opened_by(entry)]
        every_port = entry.port is None and (
            net is None or net.num_addresses > 1 or bool(covered) or (gateway is not None and gateway in net)
        )
        exposed = _exposed_ports(entry, listening) if every_port else ""
        if opened:
            named = "; ".join(s.described(entry, gateway) for s in opened)
            also = f" It opens every other port there too{exposed}." if every_port else ""
            warnings.append(
                f"hostAccess entry {_quote(entry.text)} opens the console's own {named}: "
                f"an agent could read or change the console's data or reach its operator pages.{also} "
                f"Remove the entry, or name only the ports agents need on the agents' gateway{example}."
            )
            continue
        if every_port:
            warnings.append(
                f"hostAccess entry {_quote(entry.text)} opens every port on {_every_address(net)} to the agents: "
                f"the console, the database and any other service the host listens on{exposed}. Name the ports "
                f"agents need on the agents' gateway instead{example}."
            )
            continue
        if covered and len(covered) > 1:
            # The gateway is the address agents reach the host on: the one to name, when covered.
            one = gateway if gateway in covered else covered[0]
            warnings.append(
                f"hostAccess entry {_quote(entry.text)} opens port {entry.port} on {len(covered)} addresses of this "
                f"host: {', '.join(str(a) for a in covered)}, not only on the agents' gateway. Name the one "
                f'address agents need instead (e.g. "{_gateway_entry(one, entry.port).text}").'
            )
    return warnings


def console_port_warning(entries: Iterable[str], orchestrator_url: str, gateway: str) -> str | None:
    """The warning for a ``hostAccess`` list that does not open the console's port on the agents'
    gateway, or None when it does (or the URL names no port). Agents register and heartbeat
    through that port, so without it new agents never register and running ones are lost when
    their next heartbeat fails; an explicit list replaces the default that opens it."""
    parsed = _url_port(orchestrator_url) if isinstance(orchestrator_url, str) else None
    if parsed is None:
        return None
    port = parsed[1]
    try:
        address = ipaddress.ip_address(str(gateway).strip())
    except ValueError:
        return None
    for text in entries:
        try:
            entry = parse_host_access_entry(text)
        except HostAccessError:
            continue
        if entry.port not in (None, port):
            continue
        if (entry.daddr is None and address.version == 4) or (entry.daddr is not None and address in entry.daddr):
            return None
    default_entry = f"{_bracketed(str(address))}:{port}"
    return (
        f"this list does not open the console's port {port} on the agents' gateway {address} "
        f'(the default has "{default_entry}"): new agents of this label set cannot register, and running '
        f'ones are lost at their next heartbeat. Add "{default_entry}" unless that is what you want.'
    )


def describe_host_access_entry(entry: HostAccessEntry) -> str:
    """Plain words for one parsed entry, for the host-access editor.

    ``*:4000`` → ``TCP and UDP port 4000 on any IPv4 address of the host``;
    ``192.168.1.40`` → ``every port and protocol on 192.168.1.40``.
    """
    if entry.daddr is None:
        where = "any IPv4 address of the host"
    elif entry.daddr.prefixlen == entry.daddr.max_prefixlen:
        where = str(entry.daddr.network_address)
    else:
        where = f"host addresses in {entry.daddr}"
    if entry.port is None:
        return f"every port and protocol on {where}"
    return f"TCP and UDP port {entry.port} on {where}"


def _normal_form(text: str) -> str:
    try:
        return parse_host_access_entry(text).canonical
    except HostAccessError:
        return text.strip() if isinstance(text, str) else repr(text)


def same_host_access(one: Iterable[str] | None, other: Iterable[str] | None) -> bool:
    """Whether two ``hostAccess`` values allow the same: both the default (None), or the same
    entries in normal form, compared as a set. Order, repeats and spelling (``8000`` is
    ``*:8000``) do not count: every entry's rules accept, so no order of them changes what an
    agent may reach (``network.nft.plan``). An entry that does not parse counts as written."""
    if one is None or other is None:
        return one is None and other is None
    return {_normal_form(text) for text in one} == {_normal_form(text) for text in other}


def parse_host_access(entries: Iterable[str]) -> list[HostAccessEntry]:
    """Parse a whole ``hostAccess`` list, all or nothing.

    Raises :class:`HostAccessError` for the first bad entry, its message prefixed with the entry's
    index (``hostAccess[2]: ...``), so nothing is applied from a list with one bad entry.
    """
    parsed = []
    for index, text in enumerate(entries):
        try:
            parsed.append(parse_host_access_entry(text))
        except HostAccessError as exc:
            raise HostAccessError(exc.entry, f"hostAccess[{index}]: {exc}") from None
    return parsed


# --- resolving one agent's host access -----------------------------------------------------------

#: Ports implied by a URL scheme when the URL names none.
SCHEME_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _url_port(url: str) -> tuple[str | None, int | None, bool] | None:
    """(host, port, explicit) for a URL, or None when it does not parse or its scheme has no default port."""
    try:
        parts = urlsplit(url.strip())
        explicit = parts.port
    except (ValueError, AttributeError):
        return None
    if explicit is not None:
        if explicit == 0:
            return None
        return parts.hostname, explicit, True
    implied = SCHEME_PORTS.get(parts.scheme.lower())
    if implied is None or not parts.netloc:
        return None
    return parts.hostname, implied, False


def _ip_literal(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not host:
        return None
    if _DOTTED_QUAD.fullmatch(host):
        try:
            return ipaddress.IPv4Address(host)
        except ValueError:
            return None
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return None


def agent_facing_storage_url(
    storage_type: str | None,
    *,
    external_endpoint: str | None = None,
    endpoint: str | None = None,
    fs_base_url: str | None = None,
    console_port: int | str | None = None,
) -> str | None:
    """The storage URL a scaled agent dials, from the storage settings.

    ``s3``: ``external_endpoint`` (KICI_STORAGE_EXTERNAL_ENDPOINT) else ``endpoint``
    (KICI_STORAGE_ENDPOINT); ``filesystem``: ``fs_base_url`` (KICI_STORAGE_FS_BASE_URL) else
    ``http://127.0.0.1:<console_port>`` (KICI_PORT); anything else, or nothing set: ``None``.
    """
    kind = (storage_type or "").strip().lower()
    if kind == "s3":
        return external_endpoint or endpoint or None
    if kind == "filesystem":
        if fs_base_url:
            return fs_base_url
        if console_port not in (None, ""):
            return f"http://127.0.0.1:{console_port}"
    return None


def storage_host_access_entries(storage_url: str | None) -> list[str]:
    """Host-access entries for the agent-facing storage endpoint ``storage_url`` (see
    :func:`agent_facing_storage_url`, or ``None``): ``["<ip>:<port>"]`` for an IP literal (IPv6
    bracketed; port explicit or from the scheme: http/ws 80, https/wss 443), ``["*:<port>"]`` for a
    name with an explicit port, else ``[]`` (a name reached through forward, an unknown scheme without
    a port, ``None``, an unparseable URL). Never raises.
    """
    if not storage_url or not isinstance(storage_url, str):
        return []
    parsed = _url_port(storage_url)
    if parsed is None:
        return []
    host, port, explicit = parsed
    literal = _ip_literal(host)
    if isinstance(literal, ipaddress.IPv4Address):
        return [f"{literal}:{port}"]
    if isinstance(literal, ipaddress.IPv6Address):
        return [f"[{literal}]:{port}"]
    if explicit:
        return [f"*:{port}"]
    return []


def _policy_host_access(policy: Any) -> list[str] | None:
    if policy is None:
        return None
    if isinstance(policy, dict):
        if "host_access" in policy:
            value = policy["host_access"]
        else:
            value = policy.get("hostAccess")
    else:
        value = getattr(policy, "host_access", None)
    return None if value is None else list(value)


def console_port(orchestrator_url: str) -> int | None:
    """The port agents reach the console on: explicit in ``orchestrator_url`` or implied by its
    scheme (http/ws 80, https/wss 443); None when the URL does not parse or names no port."""
    parsed = _url_port(orchestrator_url) if isinstance(orchestrator_url, str) else None
    return None if parsed is None else parsed[1]


def _bracketed(address: str) -> str:
    """``address`` as a host-access entry's address part: IPv6 literals in brackets."""
    try:
        if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address):
            return f"[{address}]"
    except ValueError:
        pass
    return address


def resolve_agent_host_access(
    policy: Any,
    orchestrator_url: str,
    gateway: str,
    host_services: Iterable[str] | None = None,
    gateway6: str | None = None,
) -> list[str]:
    """The ``hostAccess`` list in force for one agent sandbox, as entry strings (parsed, and refused,
    by the renderer). ``policy``: the label set's network policy (an object with ``host_access``, a
    dict with ``host_access``/``hostAccess``, or ``None``); its explicit list, even ``[]``, wins
    outright, else the default from ``gateway``, ``gateway6``, the console port of
    ``orchestrator_url`` and ``host_services``. The default, and why the console port is opened on
    the gateways only: docs/nft-isolation.md ("Host access entries").
    """
    explicit = _policy_host_access(policy)
    if explicit is not None:
        return explicit
    gateways = [_bracketed(str(gw).strip()) for gw in (gateway, gateway6) if gw]
    candidates = [f"{gateways[0]}:53"]
    port = console_port(orchestrator_url)
    if port is not None:
        candidates += [f"{gw}:{port}" for gw in gateways]
    candidates.extend(host_services or ())
    seen: set[str] = set()
    resolved = []
    for item in candidates:
        if item not in seen:
            seen.add(item)
            resolved.append(item)
    return resolved
