"""Orphan sweeps of a Firecracker scaler, planned first so an operator can preview them.
:func:`plan_orphans` is pure over :class:`OrphanFacts`; :func:`apply_orphans` re-checks every
target against the host as it is now before acting, so a plan that went stale while awaiting
approval never reaps something live. The passes and what is kept: docs/sandbox-ownership.md
("Orphan VMs").
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from network.netlink import tap_name_for

from ..orphans import OrphanTarget
from ..ownership import MINE, Owner, judge_ownership

log = logging.getLogger(__name__)

TAP_RE = re.compile(r"^kici-[0-9a-f]{8}$")
RESERVED_LINKS = frozenset({"kici-br0", "kici-br1", "kici-m01"})
SWEEP_INTERVAL_S = 900.0


@dataclass(frozen=True)
class AllocationRow:
    """One ``ip_allocations`` row as the planner sees it."""

    ip: str
    vm_id: str
    scaler_name: str
    tap_device: str


@dataclass(frozen=True)
class OrphanFacts:
    """A snapshot of the host for one scaler. ``rule_ips``: agent IPs with rules in the table
    (None when the listing failed: then no rule is planned). ``owner``: this console's claim on
    the scaler; ``owners``: the owner file's labels of each of ``chroot_ids`` (None: unreadable)."""

    scaler_name: str
    tracked: frozenset[str]
    chroot_ids: tuple[str, ...]
    live_chroots: frozenset[str]
    allocations_before: tuple[AllocationRow, ...]
    links: tuple[str, ...]
    allocations_after: tuple[AllocationRow, ...]
    rule_ips: frozenset[str] | None
    owner: Owner
    owners: Mapping[str, Mapping[str, str] | None]


def vm_target(
    pass_no: int, kind: str, agent_id: str | None = None, ip: str | None = None, tap: str | None = None, *, scaler: str
) -> OrphanTarget:
    """One planned action of pass ``pass_no`` (1-4 as in the module doc); ``kind`` ``allocation``,
    ``chroot`` (target: the VM id), ``tap`` (the interface) or ``rules`` (the address)."""
    if kind == "allocation":
        reason = f"pass 1: release {ip} of {agent_id}, delete TAP {tap}, remove its directory"
    elif kind == "chroot":
        reason = f"pass 2: remove the directory of {agent_id} (no allocation, no live process)"
    elif kind == "tap":
        reason = f"pass 3: delete stray interface {tap}"
    else:
        reason = f"pass 4: delete the isolation rules of {ip} (was {agent_id})"
    target = {"tap": tap, "rules": ip}.get(kind, agent_id)
    return OrphanTarget(
        kind, str(target or ""), scaler, agent_id or "", reason, {"pass": pass_no, "ip": ip, "tap": tap}
    )


def vm_live_reason(vm_id: str, tracked: Container[str], pid_running: bool) -> str | None:
    """Why the VM ``vm_id`` is live, so nothing of it is reaped; None when it is not.

    Live: tracked (an active agent row or this process owns it), or its chroot's pid file names a
    running process (confirmed or not: a chroot is never deleted from under a live process).
    """
    if vm_id in tracked:
        return "tracked: an active agent row or this process owns it"
    if pid_running:
        return "its pid file names a running process"
    return None


def not_mine(facts: OrphanFacts) -> dict[str, str]:
    """``{vm_id: reason}`` for every chroot whose owner file is not this console's (another
    console's or scaler's, or ownership unknown: ``ownership.judge_ownership``)."""
    out = {}
    for vm_id in facts.chroot_ids:
        verdict = judge_ownership(facts.owners.get(vm_id), facts.owner)
        if verdict.ownership != MINE:
            out[vm_id] = verdict.reason
    return out


def spared_vms(facts: OrphanFacts) -> list[tuple[str, str]]:
    """``(vm_id, reason)`` for every chroot or tracked VM that is not this console's (:func:`not_mine`)
    or that :func:`vm_live_reason` spares, sorted."""
    foreign = not_mine(facts)
    spared = []
    for vm_id in sorted(set(facts.chroot_ids) | set(facts.tracked)):
        reason = foreign.get(vm_id) or vm_live_reason(vm_id, facts.tracked, vm_id in facts.live_chroots)
        if reason is not None:
            spared.append((vm_id, reason))
    return spared


@dataclass
class OrphanReport:
    """What :func:`apply_orphans` did: ``cleaned`` (passes 1-3), ``rules_deleted`` (pass 4), and
    ``skipped`` targets with the reason the re-check refused them."""

    cleaned: int = 0
    rules_deleted: int = 0
    done: list[OrphanTarget] = field(default_factory=list)
    skipped: list[tuple[OrphanTarget, str]] = field(default_factory=list)


def plan_orphans(facts: OrphanFacts) -> list[OrphanTarget]:
    """The targets of the four passes for ``facts``, in pass order (pure; see the module doc)."""
    kept = {
        vm_id
        for vm_id in set(facts.tracked) | set(facts.live_chroots)
        if vm_live_reason(vm_id, facts.tracked, vm_id in facts.live_chroots) is not None
    } | set(not_mine(facts))  # live, or not this console's
    mine = [r for r in facts.allocations_before if r.scaler_name == facts.scaler_name]
    allocated_vms = {r.vm_id for r in facts.allocations_before}
    plan: list[OrphanTarget] = []
    for r in mine:
        if r.vm_id not in kept:
            plan.append(vm_target(1, "allocation", r.vm_id, r.ip, r.tap_device, scaler=facts.scaler_name))
    for vm_id in sorted(facts.chroot_ids):
        if vm_id not in allocated_vms and vm_id not in kept:
            plan.append(vm_target(2, "chroot", vm_id, scaler=facts.scaler_name))
    allocated_taps = {r.tap_device for r in facts.allocations_before + facts.allocations_after}
    kept_taps = set()
    for vm_id in kept:
        try:
            kept_taps.add(tap_name_for(vm_id))
        except ValueError:
            pass
    for name in sorted(set(facts.links)):
        if TAP_RE.match(name) and name not in RESERVED_LINKS and name not in allocated_taps and name not in kept_taps:
            plan.append(vm_target(3, "tap", tap=name, scaler=facts.scaler_name))
    if facts.rule_ips is not None:
        for r in mine:
            if r.vm_id not in kept and r.ip in facts.rule_ips:
                plan.append(vm_target(4, "rules", r.vm_id, r.ip, scaler=facts.scaler_name))
    return plan


def apply_orphans(backend: Any, plan: Iterable[OrphanTarget]) -> OrphanReport:
    """Carry out ``plan`` on ``backend`` (a ``FirecrackerBackend``), re-checking each target first.

    Each step failing is logged and the target counted as skipped; the sweep goes on.
    """
    report = OrphanReport()
    for target in plan:
        try:
            why = backend.orphan_recheck(target)
            if why is None:
                backend.orphan_act(target)
        except Exception as e:  # one bad target must not stop the sweep
            log.warning("orphan target %s failed: %s", target, e, exc_info=True)
            why = f"failed: {e}"
        if why is not None:
            report.skipped.append((target, why))
            continue
        report.done.append(target)
        if target.kind == "rules":
            report.rules_deleted += 1
        else:
            report.cleaned += 1
    return report


class PeriodicSweep:
    """Runs ``sweep()`` every ``interval_s`` seconds (15 min by default) in a daemon thread.

    Non-reentrant: :meth:`run_once` returns None without running while another run is in progress
    (from the timer or a direct call). :meth:`stop` ends the thread.
    """

    def __init__(self, sweep: Callable[[], Any], interval_s: float = SWEEP_INTERVAL_S, name: str = "fc-sweep"):
        self.sweep = sweep
        self.interval_s = interval_s
        self.name = name
        self._running = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.runs = 0

    def run_once(self) -> Any:
        if not self._running.acquire(blocking=False):
            return None
        try:
            self.runs += 1
            return self.sweep()
        except Exception:  # the next tick tries again
            log.warning("%s failed", self.name, exc_info=True)
            return None
        finally:
            self._running.release()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.run_once()

    def start(self) -> PeriodicSweep:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
