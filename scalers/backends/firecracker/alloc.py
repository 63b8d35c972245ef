"""The allocator interface the Firecracker backend uses, over the ``ip_allocations`` table (SPEC h).

``allocate(vm_id, scaler_name) -> network.ipalloc.Allocation``, ``release(vm_id) -> ip | None``,
``lookup(vm_id) -> IpAllocation | None``, ``rows() -> list[IpAllocation]``.

Address choice is ``network.ipalloc.IpAllocator`` (lowest free address, gateway skipped) fed with
the table's rows; the row insert is the arbiter: a primary-key conflict with another console means
re-reading and re-picking, at most 16 times (IP-12).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from network.ipalloc import Allocation, IpAllocator
from network.models import IpAllocation
from network.netlink import tap_name_for

MAX_CONFLICTS = 16


class DbAllocations:
    """Allocations of one subnet (``cidr``, ``gateway``) stored in ``network.IpAllocation`` rows."""

    def __init__(self, cidr: str, gateway: str):
        IpAllocator(cidr, gateway, taken={})  # validates both
        self.cidr, self.gateway = cidr, gateway

    def allocate(self, vm_id: str, scaler_name: str) -> Allocation:
        """Insert a row for ``vm_id``; an existing row for it is returned as is.

        Raises ``network.ipalloc.IpPoolExhausted`` or RuntimeError after 16 consecutive conflicts.
        """
        for _ in range(MAX_CONFLICTS):
            existing = self.lookup(vm_id)
            rows = list(IpAllocation.objects.values_list("ip", "vm_id", "tap_device"))
            pool = IpAllocator.from_live_state(self.cidr, self.gateway, [(ip, v) for ip, v, _ in rows])
            if existing is not None:
                return pool.allocation_for(vm_id, existing.ip, existing.tap_device)
            tap = tap_name_for(vm_id, {t: v for _, v, t in rows})
            alloc = pool.allocate(vm_id, tap_device=tap)
            try:
                with transaction.atomic():
                    IpAllocation.objects.create(
                        ip=alloc.ip, vm_id=vm_id, scaler_name=scaler_name, tap_device=alloc.tap_device, mac_address=alloc.mac
                    )
            except IntegrityError:
                continue
            return alloc
        raise RuntimeError(f"{MAX_CONFLICTS} consecutive ip_allocations_pkey conflicts")

    def release(self, vm_id: str) -> str | None:
        row = self.lookup(vm_id)
        if row is None:
            return None
        IpAllocation.objects.filter(vm_id=vm_id).delete()
        return str(row.ip)

    def lookup(self, vm_id: str) -> IpAllocation | None:
        return IpAllocation.objects.filter(vm_id=vm_id).first()

    def rows(self) -> list[IpAllocation]:
        return list(IpAllocation.objects.all())
