"""Orphan sweeps of a Firecracker scaler, planned first so an operator can preview them
(SPEC h ``cleanupOrphans``; seed firecracker-backend.d.ts; FC-12..14).

:func:`plan_orphans` is pure: it takes :class:`OrphanFacts` (what the host looked like) and returns
:class:`OrphanTarget` s. :func:`apply_orphans` re-checks every target against the host as it is
now before acting, so a plan that went stale while awaiting approval never reaps something live.

Passes (live = tracked ids ∪ chroot dirs whose pid file names a running process, confirmed or not):
 1. ``ip_allocations`` rows of this scaler whose VM is not live: logs forwarded, TAP deleted, IP
    released, directory removed.
 2. chroot dirs with no allocation row at all (any scaler), not live: logs forwarded, directory removed.
 3. interfaces named ``kici-<8 hex>`` (not ``kici-br0``/``kici-br1``/``kici-m01``), in no allocation
    read before or after listing the links, not derived from a live id: deleted.
 4. isolation rules of IPs this scaler allocated to a VM that is not live: deleted. Rules the DB
    does not attribute to this scaler are left alone (another scaler on the host owns them).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from network.netlink import tap_name_for

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
    (None when the listing failed: then no rule is planned)."""

    scaler_name: str
    tracked: frozenset[str]
    chroot_ids: tuple[str, ...]
    live_chroots: frozenset[str]
    allocations_before: tuple[AllocationRow, ...]
    links: tuple[str, ...]
    allocations_after: tuple[AllocationRow, ...]
    rule_ips: frozenset[str] | None


@dataclass(frozen=True)
class OrphanTarget:
    """One planned action. ``pass_no`` 1-4 as in the module doc; ``kind`` ``allocation``,
    ``chroot``, ``tap`` or ``rules``."""

    pass_no: int
    kind: str
    agent_id: str | None = None
    ip: str | None = None
    tap: str | None = None

    def describe(self) -> str:
        if self.kind == "allocation":
            return f"pass 1: release {self.ip} of {self.agent_id}, delete TAP {self.tap}, remove its directory"
        if self.kind == "chroot":
            return f"pass 2: remove the directory of {self.agent_id} (no allocation, no live process)"
        if self.kind == "tap":
            return f"pass 3: delete stray interface {self.tap}"
        return f"pass 4: delete the isolation rules of {self.ip} (was {self.agent_id})"


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
    live = set(facts.tracked) | set(facts.live_chroots)
    mine = [r for r in facts.allocations_before if r.scaler_name == facts.scaler_name]
    allocated_vms = {r.vm_id for r in facts.allocations_before}
    plan: list[OrphanTarget] = []
    for r in mine:
        if r.vm_id not in live:
            plan.append(OrphanTarget(1, "allocation", r.vm_id, r.ip, r.tap_device))
    for vm_id in sorted(facts.chroot_ids):
        if vm_id not in allocated_vms and vm_id not in live:
            plan.append(OrphanTarget(2, "chroot", vm_id))
    allocated_taps = {r.tap_device for r in facts.allocations_before + facts.allocations_after}
    live_taps = set()
    for vm_id in live:
        try:
            live_taps.add(tap_name_for(vm_id))
        except ValueError:
            pass
    for name in sorted(set(facts.links)):
        if TAP_RE.match(name) and name not in RESERVED_LINKS and name not in allocated_taps and name not in live_taps:
            plan.append(OrphanTarget(3, "tap", tap=name))
    if facts.rule_ips is not None:
        for r in mine:
            if r.vm_id not in live and r.ip in facts.rule_ips:
                plan.append(OrphanTarget(4, "rules", r.vm_id, r.ip))
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
        except Exception as e:  # noqa: BLE001 - one bad target must not stop the sweep
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
    (from the timer or a direct call). :meth:`stop` ends the thread (SPEC h periodic sweep).
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
        except Exception:  # noqa: BLE001 - the next tick tries again
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
