"""Orphan sweeps of one Firecracker scaler on the live host: facts, re-checks, actions.

The planning itself is ``orphans.plan_orphans`` (pure); :class:`OrphanSweeps` reads the host for
it and carries out a plan, re-checking every target right before acting.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from agents.choices import ACTIVE_STATES
from agents.models import Agent
from network import netlink

from ..orphans import OrphanTarget
from ..ownership import MINE, UNKNOWN_REASON, Owner, judge_ownership
from . import jail
from .logs import LogSink, forward_remaining
from .orphans import (
    AllocationRow,
    OrphanFacts,
    OrphanReport,
    apply_orphans,
    not_mine,
    plan_orphans,
    vm_live_reason,
)
from .pidprobe import is_chroot_pid_running
from .rules import RuleWriter
from .settings import FirecrackerSettings

log = logging.getLogger(__name__)


def default_tracked_provider(scaler_name: str) -> set[str]:
    """Agent ids of this scaler that the database holds in an active state (any console process)."""
    return set(
        Agent.objects.filter(scaler__name=scaler_name, state__in=ACTIVE_STATES).values_list("agent_id", flat=True)
    )


class OrphanSweeps:
    """The sweeps of the scaler ``settings`` names.

    ``tracked()``: the ids that count as live whatever their chroot shows (this process's VMs and
    those other processes are spawning or running); a failure there aborts the sweep, so nothing is
    reaped blind. ``ip_allocator``: ``network.ipalloc_db.DbIpAllocator``; ``log_sink``: where the
    remaining logs of a reaped VM go. ``owner()``: this console's ``ownership.Owner`` of the
    scaler; a VM dir whose owner file is not its own is never touched.
    """

    def __init__(
        self,
        settings: FirecrackerSettings,
        nft: Any,
        ip_allocator: Any,
        rules: RuleWriter,
        tracked: Callable[[], set[str]],
        log_sink: LogSink | None = None,
        *,
        owner: Callable[[], Owner],
    ):
        self.settings = settings
        self.name = settings.name
        self.nft = nft
        self.ip_allocator = ip_allocator
        self.rules = rules
        self.tracked = tracked
        self.log_sink = log_sink
        self.owner = owner

    def chroot_dir(self, agent_id: str):
        return jail.chroot_dir(self.settings.chroot_base_dir, agent_id)

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
        """Read the host once for :func:`plan_orphans`; a VM dir of unknown ownership is logged.
        Raises when the tracked set or the owner cannot be read."""
        tracked = self.tracked()
        owner = self.owner()
        chroot_ids = self._chroot_ids()
        owners = {i: jail.read_owner(self.settings.chroot_base_dir, i) for i in chroot_ids}
        live = {i for i in chroot_ids if is_chroot_pid_running(self.chroot_dir(i))}
        before = self._rows()
        links = tuple(netlink.link_names(netns=self.settings.netns))
        after = self._rows()
        try:
            rule_ips = frozenset(str(a) for a in self.nft.list_agents())
        except Exception as e:  # noqa: BLE001 - a failed listing reaps no rule
            log.warning("rule listing failed, no isolation rule will be reaped: %s", e)
            rule_ips = None
        facts = OrphanFacts(
            scaler_name=self.name,
            tracked=frozenset(tracked),
            chroot_ids=tuple(chroot_ids),
            live_chroots=frozenset(live),
            allocations_before=before,
            links=links,
            allocations_after=after,
            rule_ips=rule_ips,
            owner=owner,
            owners=owners,
        )
        for vm_id, reason in not_mine(facts).items():
            if reason.startswith(UNKNOWN_REASON):
                log.warning("VM dir %s of scaler %s is never reaped: %s", vm_id, self.name, reason)
        return facts

    def plan_orphans(self) -> list[OrphanTarget]:
        """What a sweep would do now; touches nothing (for previews)."""
        return plan_orphans(self.orphan_facts())

    def _live(self, agent_id: str | None) -> bool:
        """The planner's liveness rule (:func:`vm_live_reason`) on what is true now."""
        if agent_id is None:
            return False
        pid_running = is_chroot_pid_running(self.chroot_dir(agent_id))
        return vm_live_reason(agent_id, self.tracked(), pid_running) is not None

    def _not_mine_now(self, agent_id: str | None) -> str | None:
        """Why the VM dir of ``agent_id`` is not this console's now (its owner file read afresh);
        None when it is, or when there is no such dir."""
        if not agent_id or not jail.vm_dir(self.settings.chroot_base_dir, agent_id).exists():
            return None
        verdict = judge_ownership(jail.read_owner(self.settings.chroot_base_dir, agent_id), self.owner())
        return None if verdict.ownership == MINE else verdict.reason

    def orphan_recheck(self, target: OrphanTarget) -> str | None:
        """None when ``target`` is still an orphan now, else why it is spared."""
        if target.kind in ("allocation", "chroot", "rules"):
            spared = self._vm_spared_now(target.agent_id)
            if spared is not None:
                return spared
        rows = self._rows()
        if target.kind == "allocation":
            return self._allocation_spared(target, rows)
        if target.kind == "chroot":
            return _chroot_spared(target, rows)
        if target.kind == "tap":
            return self._tap_spared(target, rows)
        if target.kind == "rules":
            return _rules_spared(target, rows)
        return None

    def _vm_spared_now(self, agent_id: str | None) -> str | None:
        """Why the VM of ``agent_id`` is spared now: its dir is another console's, or it is live."""
        foreign = self._not_mine_now(agent_id)
        if foreign is not None:
            return foreign
        if self._live(agent_id):
            return "the VM is live now"
        return None

    def _allocation_spared(self, target: OrphanTarget, rows: tuple[AllocationRow, ...]) -> str | None:
        """An orphan allocation is spared when its row (VM, address, scaler) is no longer there."""
        if not any(r.vm_id == target.agent_id and r.ip == target.ip and r.scaler_name == self.name for r in rows):
            return "the allocation changed"
        return None

    def _tap_spared(self, target: OrphanTarget, rows: tuple[AllocationRow, ...]) -> str | None:
        """An orphan TAP is spared when it is gone, or an allocation row, a tracked VM or a VM dir
        of another console now names it."""
        if target.tap not in netlink.link_names(netns=self.settings.netns):
            return "the interface is gone"
        if any(r.tap_device == target.tap for r in rows):
            return "an allocation row names the interface"
        live_ids = self.tracked()
        if any(netlink.tap_name_for(i) == target.tap for i in live_ids):
            return "a tracked VM owns the interface"
        for vm_id in self._chroot_ids():
            if netlink.tap_name_for(vm_id) != target.tap:
                continue
            foreign = self._not_mine_now(vm_id)
            if foreign is not None:
                return f"the interface is of VM {vm_id}: {foreign}"
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
            assert target.ip is not None, "a rules target names its address"
            if not self.rules.remove_unless_held(target.agent_id, target.ip, f"orphan rules of {target.agent_id}"):
                raise RuntimeError(f"the address {target.ip} is held again: its rules were kept")

    def apply_orphans(self, plan: Iterable[OrphanTarget]) -> OrphanReport:
        """Apply a plan from :meth:`plan_orphans` (re-checking each target)."""
        report = apply_orphans(self, plan)
        if report.cleaned or report.rules_deleted:
            log.info("scaler %s: reaped %d orphans, %d rule sets", self.name, report.cleaned, report.rules_deleted)
        return report

    def cleanup_orphans(self) -> int:
        """Plan and apply now; returns the number of orphans cleaned in passes 1-3."""
        return self.apply_orphans(self.plan_orphans()).cleaned


def _chroot_spared(target: OrphanTarget, rows: tuple[AllocationRow, ...]) -> str | None:
    """An orphan VM dir is spared when an allocation row for its VM appeared."""
    if any(r.vm_id == target.agent_id for r in rows):
        return "an allocation row appeared"
    return None


def _rules_spared(target: OrphanTarget, rows: tuple[AllocationRow, ...]) -> str | None:
    """Orphan isolation rules are spared when their address was allocated to another VM again."""
    if any(r.ip == target.ip and r.vm_id != target.agent_id for r in rows):
        return "the address was allocated again"
    return None
