"""VM address allocation on a bridge subnet.

Pure helpers plus :class:`IpAllocator`, whose state is always rebuilt from live state handed in by
the caller (``IpAllocation`` rows and the addresses found on interfaces): there is deliberately no
way to build one "from empty", because an allocator that forgets live VMs hands their addresses to
new ones, and those inherit the old VM's isolation rules. The database-backed allocator used by
consoles is ``network.ipalloc_db``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from network.netlink import tap_name_for

_DOTTED = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})", re.ASCII)


def ip_to_number(ip: str) -> int:
    """``"10.0.0.1"`` → 167772161. Raises ``ValueError("Invalid IP address: ...")``."""
    match = _DOTTED.fullmatch(ip) if isinstance(ip, str) else None
    if match is None or any(int(o) > 255 for o in match.groups()):
        raise ValueError(f"Invalid IP address: {ip!r}")
    a, b, c, d = (int(o) for o in match.groups())
    return (a << 24) | (b << 16) | (c << 8) | d


def number_to_ip(number: int) -> str:
    """167772161 → ``"10.0.0.1"``. Raises ``ValueError`` outside 0..2**32-1."""
    if not isinstance(number, int) or not 0 <= number <= 0xFFFFFFFF:
        raise ValueError(f"Invalid IP number: {number!r}")
    return ".".join(str((number >> shift) & 0xFF) for shift in (24, 16, 8, 0))


@dataclass(frozen=True)
class CidrRange:
    """A subnet's usable host range: ``network`` (``10.0.0.0/24``), ``prefix`` (24),
    ``start``/``end`` (first and last usable address: network+1 .. broadcast-1), ``netmask``."""

    network: str
    prefix: int
    start: str
    end: str
    netmask: str

    def __contains__(self, ip: str) -> bool:
        return ip_to_number(self.start) <= ip_to_number(ip) <= ip_to_number(self.end)


def parse_cidr(cidr: str) -> CidrRange:
    """``"10.0.0.0/24"`` → start ``10.0.0.1``, end ``10.0.0.254``.

    Raises ``ValueError`` naming the value for a malformed CIDR, one with host bits set, or one
    with no usable address (/31, /32).
    """
    if not isinstance(cidr, str) or "/" not in cidr:
        raise ValueError(f"Invalid CIDR: {cidr!r} (expected a.b.c.d/len)")
    addr, _, length = cidr.partition("/")
    ip_to_number(addr)
    try:
        net = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as exc:
        raise ValueError(f"Invalid CIDR: {cidr!r} ({exc})") from None
    if net.num_addresses < 4:
        raise ValueError(f"Invalid CIDR: {cidr!r} has no usable host addresses")
    first = int(net.network_address) + 1
    last = int(net.broadcast_address) - 1
    return CidrRange(
        network=str(net),
        prefix=net.prefixlen,
        start=number_to_ip(first),
        end=number_to_ip(last),
        netmask=str(net.netmask),
    )


def mac_for_ip(ip: str) -> str:
    """``"10.0.1.42"`` → ``"06:00:AC:00:01:2A"``: locally administered, from the last three octets.
    Raises ``ValueError("Invalid IP address: ...")``."""
    n = ip_to_number(ip)
    return "06:00:AC:" + ":".join(f"{(n >> s) & 0xFF:02X}" for s in (16, 8, 0))


class IpPoolExhausted(RuntimeError):
    """No free address: ``IP pool exhausted: no available addresses in <start>-<end>``."""


@dataclass(frozen=True)
class Allocation:
    """One VM's network identity: ``ip``, ``mac``, ``tap_device``, plus the subnet's ``gateway``,
    ``netmask`` and ``prefix`` (echoed for the VM's boot arguments)."""

    vm_id: str
    ip: str
    mac: str
    tap_device: str
    gateway: str
    netmask: str
    prefix: int


class IpAllocator:
    """In-memory allocator for one subnet (workers and the CLI reaper).

    ``cidr``: the subnet (``10.0.0.0/24``); ``gateway``: never handed out. ``taken``: the live
    state, REQUIRED: a mapping of address → vm id (or ``None`` for an address held by something
    else, e.g. found on an interface). Addresses outside the subnet are ignored. Allocation scans
    ascending from the first usable address. Raises ``ValueError`` for bad arguments.
    """

    def __init__(self, cidr: str, gateway: str, *, taken: Mapping[str, str | None]):
        self.range = parse_cidr(cidr)
        ip_to_number(gateway)
        self.gateway = gateway
        self._by_ip: dict[int, str | None] = {}
        self._by_vm: dict[str, int] = {}
        for ip, vm_id in taken.items():
            self.mark_taken(ip, vm_id)

    @classmethod
    def from_live_state(
        cls,
        cidr: str,
        gateway: str,
        allocations: Iterable[tuple[str, str]],
        interface_addresses: Iterable[str] = (),
    ) -> IpAllocator:
        """Rebuild from ``allocations`` (``(ip, vm_id)`` pairs, e.g. ``IpAllocation`` rows) and
        ``interface_addresses`` (addresses found on host interfaces, held by nobody we track)."""
        taken: dict[str, str | None] = {ip: None for ip in interface_addresses}
        taken.update(dict(allocations))
        return cls(cidr, gateway, taken=taken)

    def mark_taken(self, ip: str, vm_id: str | None = None) -> None:
        """Record an address as held (by ``vm_id``, or by something untracked)."""
        n = ip_to_number(ip)
        if not ip_to_number(self.range.start) <= n <= ip_to_number(self.range.end):
            return
        self._by_ip[n] = vm_id
        if vm_id is not None:
            self._by_vm[vm_id] = n

    def taken(self) -> dict[str, str | None]:
        """Snapshot: address → vm id (or None)."""
        return {number_to_ip(n): vm for n, vm in sorted(self._by_ip.items())}

    def candidates(self) -> Iterable[str]:
        """Free addresses in ascending order (the gateway and taken ones skipped)."""
        gw = ip_to_number(self.gateway)
        for n in range(ip_to_number(self.range.start), ip_to_number(self.range.end) + 1):
            if n != gw and n not in self._by_ip:
                yield number_to_ip(n)

    def allocation_for(self, vm_id: str, ip: str, tap_device: str | None = None) -> Allocation:
        """The full :class:`Allocation` record for ``vm_id`` holding ``ip``."""
        return Allocation(
            vm_id=vm_id,
            ip=ip,
            mac=mac_for_ip(ip),
            tap_device=tap_device or tap_name_for(vm_id),
            gateway=self.gateway,
            netmask=self.range.netmask,
            prefix=self.range.prefix,
        )

    def allocate(self, vm_id: str, tap_device: str | None = None) -> Allocation:
        """Give ``vm_id`` the lowest free address. A VM that already holds one gets
        the same one back. Raises :class:`IpPoolExhausted`."""
        if vm_id in self._by_vm:
            return self.allocation_for(vm_id, number_to_ip(self._by_vm[vm_id]), tap_device)
        for ip in self.candidates():
            self.mark_taken(ip, vm_id)
            return self.allocation_for(vm_id, ip, tap_device)
        raise IpPoolExhausted(f"IP pool exhausted: no available addresses in {self.range.start}-{self.range.end}")

    def release(self, vm_id: str) -> str | None:
        """Free ``vm_id``'s address; unknown vm → no-op. Returns the freed address."""
        n = self._by_vm.pop(vm_id, None)
        if n is None:
            return None
        self._by_ip.pop(n, None)
        return number_to_ip(n)

    def release_by_ip(self, ip: str) -> str | None:
        """Free an address; returns the vm id that held it (None if untracked or free)."""
        n = ip_to_number(ip)
        if n not in self._by_ip:
            return None
        vm_id = self._by_ip.pop(n)
        if vm_id is not None:
            self._by_vm.pop(vm_id, None)
        return vm_id
