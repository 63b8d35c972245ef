"""Database-backed VM address allocation (the ``ip_allocations`` table): a transaction-level
advisory lock on the subnet around each read-and-insert, the primary key as the backstop (a loser
re-picks, up to 16 times), and every allocation reads the live rows of all scalers first. Why:
docs/firecracker-adapter.md ("Addresses and TAP names").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.db import IntegrityError, connection, transaction

from network.ipalloc import Allocation, IpAllocator, IpPoolExhausted, mac_for_ip
from network.models import IpAllocation
from network.netlink import tap_name_for

MAX_PK_CONFLICTS = 16


class IpAllocationConflict(RuntimeError):
    """Too many consecutive primary-key conflicts: ``16 consecutive ip_allocations_pkey conflicts``."""


class DbIpAllocator:
    """Allocate VM addresses from ``cidr`` (gateway excluded) as ``IpAllocation`` rows.

    ``interface_addresses``: a callable returning addresses currently configured on host
    interfaces inside the subnet (held by something the table does not know), called on every
    allocation; default none. Raises ``ValueError`` for a bad CIDR or gateway.
    """

    def __init__(self, cidr: str, gateway: str, interface_addresses: Callable[[], Iterable[str]] | None = None):
        IpAllocator(cidr, gateway, taken={})  # validates both
        self.cidr = cidr
        self.gateway = gateway
        self.interface_addresses = interface_addresses or (lambda: ())

    def _live(self) -> IpAllocator:
        rows = IpAllocation.objects.values_list("ip", "vm_id")
        return IpAllocator.from_live_state(self.cidr, self.gateway, rows, self.interface_addresses())

    def _lock_subnet(self) -> None:
        """``pg_advisory_xact_lock`` keyed by the subnet: held until the enclosing transaction ends."""
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"kici-ipalloc:{self.cidr}"])

    def _record(self, row: IpAllocation) -> Allocation:
        return self._live().allocation_for(row.vm_id, row.ip, row.tap_device)

    def allocate(self, vm_id: str, scaler_name: str, tap_device: str | None = None) -> Allocation:
        """Insert a row giving ``vm_id`` the lowest free address; return its :class:`Allocation`.

        A VM that already has a row gets it back. On a primary-key conflict (another allocator took
        the address between our read and our insert) the live state is re-read and the next
        address tried, up to 16 times in a row, then :class:`IpAllocationConflict`. Raises
        :class:`~network.ipalloc.IpPoolExhausted` when no address is free. Safe inside an outer
        transaction (each insert runs in its own savepoint).
        """
        existing = IpAllocation.objects.filter(vm_id=vm_id).first()
        if existing is not None:
            return self._record(existing)
        lost: set[str] = set()
        for _ in range(MAX_PK_CONFLICTS):
            ip: str | None = None
            try:
                with transaction.atomic():
                    self._lock_subnet()
                    live = self._live()
                    for taken in lost:
                        live.mark_taken(taken)
                    ip = next(iter(live.candidates()), None)
                    if ip is None:
                        raise IpPoolExhausted(
                            f"IP pool exhausted: no available addresses in {live.range.start}-{live.range.end}"
                        )
                    owners = dict(IpAllocation.objects.values_list("tap_device", "vm_id"))
                    tap = tap_device or tap_name_for(vm_id, owners)
                    with transaction.atomic():
                        IpAllocation.objects.create(
                            ip=ip, vm_id=vm_id, scaler_name=scaler_name, tap_device=tap, mac_address=mac_for_ip(ip)
                        )
            except IntegrityError:
                mine = IpAllocation.objects.filter(vm_id=vm_id).first()
                if mine is not None:  # a concurrent call for the same VM won: same answer
                    return self._record(mine)
                if ip is not None:
                    lost.add(ip)
                continue
            return live.allocation_for(vm_id, ip, tap)
        raise IpAllocationConflict(
            f"{MAX_PK_CONFLICTS} consecutive ip_allocations_pkey conflicts while allocating an address for {vm_id}"
        )

    def release(self, vm_id: str) -> str | None:
        """Delete ``vm_id``'s row; unknown vm → no-op. Returns the freed address."""
        row = IpAllocation.objects.filter(vm_id=vm_id).first()
        if row is None:
            return None
        IpAllocation.objects.filter(pk=row.pk, vm_id=vm_id).delete()
        return row.ip

    def release_by_ip(self, ip: str) -> str | None:
        """Delete the row for ``ip``; returns the vm id that held it (None when free)."""
        row = IpAllocation.objects.filter(pk=ip).first()
        if row is None:
            return None
        IpAllocation.objects.filter(pk=ip, vm_id=row.vm_id).delete()
        return row.vm_id

    def allocations(self, scaler_name: str | None = None) -> list[IpAllocation]:
        """Rows, optionally only one scaler's, ordered by address."""
        rows = IpAllocation.objects.all()
        if scaler_name is not None:
            rows = rows.filter(scaler_name=scaler_name)
        return sorted(rows, key=lambda r: tuple(int(o) for o in r.ip.split(".")))
