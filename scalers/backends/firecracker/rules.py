"""The rule writer of a Firecracker scaler: each VM's isolation rules in the nft table.

A VM's rules are keyed by its address (``saddr`` = its IP). Writing happens under the address
lock (``scalers.backends.holders.address_lock``) so a teardown of the address's previous holder
cannot delete them between its holder check and its delete; removing happens only while no other
sandbox holds the address (``holders.remove_unless_held``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from network.ipalloc import mac_for_ip
from network.nft.spec import AgentSpec

from ..holders import address_lock, remove_unless_held


def agent_spec(
    ip: str, gateway: str, label_set: Mapping, host_access: Sequence[str], port: str | None = None
) -> AgentSpec:
    """The isolation rules of one VM: ``saddr`` = its IP, bound to its TAP ``port`` with the guest
    MAC the console configures for that IP (``network.ipalloc.mac_for_ip``), gateway accepted,
    policy from the label set."""
    policy = dict(label_set.get("networkPolicy") or {})
    return AgentSpec.build(
        address=ip, gateway=gateway, allowlist=list(policy.get("allowlist") or []),
        deny_all=bool(policy.get("denyAll", False)), host_access=list(host_access), port=port,
        mac=mac_for_ip(ip) if port else None,
    )  # fmt: skip


class RuleWriter:
    """Writes and removes VM rules through ``nft`` (``network.nft.apply.NftClient``).

    ``ip_allocator`` (``network.ipalloc_db.DbIpAllocator``) names the VM address allocations of
    every scaler: an allocation is a holder of its address.
    """

    def __init__(self, nft: Any, ip_allocator: Any):
        self.nft = nft
        self.ip_allocator = ip_allocator

    def write(
        self, ip: str, gateway: str, label_set: Mapping, host_access: Sequence[str], port: str | None = None
    ) -> None:
        """Build and apply the rules of the VM at ``ip`` (bound to its TAP ``port``) under the address lock."""
        with address_lock(ip):
            self.nft.apply_agent(agent_spec(ip, gateway, label_set, host_access, port))

    def allocation_rows(self) -> list[tuple[str, str, str]]:
        """``(ip, vm_id, scaler_name)`` of every address allocation (any scaler)."""
        return [(str(r.ip), r.vm_id, r.scaler_name) for r in self.ip_allocator.allocations()]

    def remove_unless_held(self, agent_id: str | None, ip: str, why: str) -> bool:
        """Delete ``ip``'s rules unless a sandbox other than VM ``agent_id`` holds it now (another
        allocation row, an active agent row: ``scalers.backends.holders``). True when deleted."""
        _, held = remove_unless_held(
            ip, self.nft.remove_agent, exclude=(agent_id or "",), allocations=self.allocation_rows, why=why
        )
        return not held
