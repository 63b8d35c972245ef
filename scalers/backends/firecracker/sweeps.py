"""Orphan sweeps wired to a live backend: facts, re-checks, actions (seed firecracker-backend.d.ts
``cleanupOrphans``/``reapUnownedIsolationRules``; SPEC h). Mixed into ``FirecrackerBackend``;
the planning itself is ``orphans.plan_orphans``."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from network import netlink

from ..orphans import OrphanTarget
from . import jail
from .logs import forward_remaining
from .orphans import (
    AllocationRow,
    OrphanFacts,
    OrphanReport,
    PeriodicSweep,
    apply_orphans,
    plan_orphans,
)
from .pidprobe import is_chroot_pid_running

log = logging.getLogger(__name__)


def default_tracked_provider(scaler_name: str) -> set[str]:
    """Agent ids of this scaler that the database holds in an active state (any console process)."""
    from agents.choices import ACTIVE_STATES
    from agents.models import Agent

    return set(
        Agent.objects.filter(scaler__name=scaler_name, state__in=ACTIVE_STATES).values_list("agent_id", flat=True)
    )


class SweepMixin:
    """Needs from the host class: ``settings``, ``name``, ``nft``, ``ip_allocator``, ``log_sink``,
    ``tracked_ids``, ``tracked_provider``, ``chroot_dir``, ``_sweeper``."""

    def _sweep_tracked(self) -> set[str]:
        tracked = set(self.tracked_ids())
        if self.tracked_provider is not None:
            tracked |= set(self.tracked_provider(self.name))  # a failure here aborts the sweep: never reap blind
        return tracked

    def _rows(self) -> tuple[AllocationRow, ...]:
        return tuple(
            AllocationRow(ip=str(r.ip), vm_id=r.vm_id, scaler_name=r.scaler_name, tap_device=r.tap_device)
            for r in self.ip_allocator.allocations()
        )

    def _chroot_ids(self) -> list[str]:
        top = os.path.join(self.settings.chroot_base_dir, "firecracker")
        try:
            names = sorted(os.listdir(top))
        except FileNotFoundError:
            return []
        return [n for n in names if jail.AGENT_ID_RE.match(n) and os.path.isdir(os.path.join(top, n))]

    def orphan_facts(self) -> OrphanFacts:
        """Read the host once for :func:`plan_orphans`. Raises when the tracked set cannot be read."""
        tracked = self._sweep_tracked()
        chroot_ids = self._chroot_ids()
        live = {i for i in chroot_ids if is_chroot_pid_running(self.chroot_dir(i))}
        before = self._rows()
        links = tuple(netlink.link_names(netns=self.settings.netns))
        after = self._rows()
        try:
            rule_ips = frozenset(str(a) for a in self.nft.list_agents())
        except Exception as e:  # noqa: BLE001 - a failed listing reaps no rule
            log.warning("rule listing failed, no isolation rule will be reaped: %s", e)
            rule_ips = None
        return OrphanFacts(
            scaler_name=self.name, tracked=frozenset(tracked), chroot_ids=tuple(chroot_ids), live_chroots=frozenset(live),
            allocations_before=before, links=links, allocations_after=after, rule_ips=rule_ips,
        )  # fmt: skip

    def plan_orphans(self) -> list[OrphanTarget]:
        """What a sweep would do now; touches nothing (for previews)."""
        return plan_orphans(self.orphan_facts())

    def _live(self, agent_id: str | None) -> bool:
        return agent_id is not None and (
            agent_id in self._sweep_tracked() or is_chroot_pid_running(self.chroot_dir(agent_id))
        )

    def orphan_recheck(self, target: OrphanTarget) -> str | None:
        """None when ``target`` is still an orphan now, else why it is spared."""
        if target.kind in ("allocation", "chroot", "rules") and self._live(target.agent_id):
            return "the VM is live now"
        rows = self._rows()
        if target.kind == "allocation":
            if not any(r.vm_id == target.agent_id and r.ip == target.ip and r.scaler_name == self.name for r in rows):
                return "the allocation changed"
        elif target.kind == "chroot":
            if any(r.vm_id == target.agent_id for r in rows):
                return "an allocation row appeared"
        elif target.kind == "tap":
            if target.tap not in netlink.link_names(netns=self.settings.netns):
                return "the interface is gone"
            if any(r.tap_device == target.tap for r in rows):
                return "an allocation row names the interface"
            live_ids = self._sweep_tracked()
            if any(netlink.tap_name_for(i) == target.tap for i in live_ids):
                return "a tracked VM owns the interface"
        elif target.kind == "rules":
            if any(r.ip == target.ip and r.vm_id != target.agent_id for r in rows):
                return "the address was allocated again"
        return None

    def orphan_act(self, target: OrphanTarget) -> None:
        """Carry out one re-checked target."""
        s = self.settings
        if target.kind in ("allocation", "chroot"):
            chroot = self.chroot_dir(target.agent_id)
            forward_remaining(target.agent_id, chroot / "serial-console.log", chroot / "vmm.log", self.log_sink)
        if target.kind == "allocation":
            if target.tap:
                netlink.delete_link(target.tap, netns=s.netns)
            self.ip_allocator.release(target.agent_id)
        if target.kind in ("allocation", "chroot"):
            jail.remove_vm_dir(s.chroot_base_dir, target.agent_id, s.require_sudo)
        elif target.kind == "tap":
            netlink.delete_link(target.tap, netns=s.netns)
        elif target.kind == "rules":
            if not self._remove_rules_unless_held(target.agent_id, target.ip, f"orphan rules of {target.agent_id}"):
                raise RuntimeError(f"the address {target.ip} is held again: its rules were kept")

    def apply_orphans(self, plan: Iterable[OrphanTarget]) -> OrphanReport:
        """Apply a plan from :meth:`plan_orphans` (re-checking each target)."""
        report = apply_orphans(self, plan)
        if report.cleaned or report.rules_deleted:
            log.info("scaler %s: reaped %d orphans, %d rule sets", self.name, report.cleaned, report.rules_deleted)
        return report

    def cleanup_orphans(self) -> int:
        """Plan and apply now; returns the number of orphans cleaned in passes 1-3 (SPEC h)."""
        return self.apply_orphans(self.plan_orphans()).cleaned

    def start_periodic_sweep(self, interval_s: float | None = None) -> PeriodicSweep:
        """Start (or return the running) 15-minute sweep for this scaler (non-reentrant)."""
        if self._sweeper is None:
            self._sweeper = PeriodicSweep(self.cleanup_orphans, interval_s or 900.0, name=f"fc-sweep:{self.name}")
        return self._sweeper.start()

    def stop_periodic_sweep(self) -> None:
        if self._sweeper is not None:
            self._sweeper.stop()
