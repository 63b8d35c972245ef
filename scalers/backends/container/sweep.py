"""Sweeping a scaler's containers and rules: orphans planned with evidence and re-checked before
removal, refused registrations, unowned rule sets (SPEC (e) ``cleanupOrphans``; rules in
:mod:`scalers.backends.orphans`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from docker.errors import APIError, NotFound

from ..docker_net import ISOLATED_NETWORK_NAME
from ..holders import address_lock, read_holders
from ..orphans import ALIVE_STATES, OrphanTarget, container_addresses, plan_container_orphans, plan_rule_orphans
from .registry import REGISTRY, db_registered_ids

log = logging.getLogger(__name__)

ORPHAN_STOP_TIMEOUT_SECONDS = 5


class SweepMixin:
    """The sweep half of :class:`~scalers.backends.container.ContainerBackend` (it provides
    ``scaler``, ``api``, ``isolation``, ``network_isolation``, ``_tracked_ids``, ``_is_registered``,
    ``_list`` and ``_remove_container``)."""

    def reap_unowned(self, agent_id: str) -> bool:
        """Force-remove this scaler's containers for one agent id (a refused registration).

        Lists by ``kici-managed=true``, own ``kici-scaler-name`` and ``kici-agent-id`` (CTR-22);
        True when one was removed; a listing error answers False.
        """
        if not agent_id or not self.scaler.name.strip():
            return False
        try:
            found = self._list(self._agent_filters(agent_id))
        except Exception:  # noqa: BLE001
            log.warning("reap_unowned(%s): listing failed", agent_id, exc_info=True)
            return False
        removed = False
        for summary in found:
            labels = summary.get("Labels") or {}
            if labels.get("kici-scaler-name") != self.scaler.name or labels.get("kici-agent-id") != agent_id:
                continue
            for address in self._addresses(summary):
                self._remove_rules_quietly(address, (summary["Id"], agent_id), f"refused registration of {agent_id}")
            removed = self._remove_container(summary["Id"]) or removed
        return removed

    # -- orphans -------------------------------------------------------------------------------

    def _registry(self) -> Callable[[str], bool] | None:
        if self._is_registered is REGISTRY:
            return None  # replaced per plan by a batched lookup
        return self._is_registered

    def list_managed(self) -> list[dict]:
        """ONE sparse list call: every ``kici-managed=true`` container on the runtime, any scaler."""
        return self._list({"label": ["kici-managed=true"]})

    def plan_orphans(self) -> list[OrphanTarget]:
        """What the sweep would remove now, with evidence; changes nothing (one list call).

        Containers per ``orphans.plan_container_orphans``; then (isolation on) rule sets for
        addresses no kici-managed container holds (``reap_unowned_isolation_rules``). Raises
        ``OrphanSweepRefused`` for a blank scaler name; a failed runtime listing raises (nothing
        can be planned blind).
        """
        summaries = self.list_managed()
        tracked = self._tracked_ids()
        probe = self._registry()
        if self._is_registered is REGISTRY:
            candidates = [
                (s.get("Labels") or {}).get("kici-agent-id", "")
                for s in summaries
                if (s.get("Labels") or {}).get("kici-scaler-name") == self.scaler.name
                and str(s.get("State", "")).lower() in ALIVE_STATES
            ]
            registered = db_registered_ids([c for c in candidates if c])
            probe = registered.__contains__
        plan = plan_container_orphans(summaries, self.scaler.name, tracked, probe)
        if self.network_isolation:
            plan += self.plan_rule_orphans(summaries)
        return plan

    def plan_rule_orphans(self, summaries: list[dict] | None = None) -> list[OrphanTarget]:
        """Rule sets on ``kici-agent-net`` addresses that nothing holds (``scalers.backends.holders``).

        ``summaries``: a listing already made, else one is made; a failed listing plans nothing.
        """
        if summaries is None:
            try:
                summaries = self.list_managed()
            except Exception:  # noqa: BLE001
                log.warning("rule reap skipped: the runtime could not be listed", exc_info=True)
                return []
        live = set(read_holders(containers=summaries))
        return plan_rule_orphans(self.isolation.addresses_with_rules(), live, self.scaler.name, self.isolation.table)

    def apply_orphans(self, plan: list[OrphanTarget]) -> int:
        """Remove what ``plan`` names, re-checking each target first; returns containers + rule sets removed.

        A container is removed only if it still carries this scaler's name and the same agent
        id, that id is still untracked, and (when alive) still unregistered; one that vanished
        meanwhile is skipped without error. A rule set is deleted only if nothing holds its
        address now (``holders.remove_unless_held``: a fresh listing under the address's lock; a
        failed listing deletes none).
        """
        count = 0
        tracked = self._tracked_ids()
        for target in (t for t in plan if t.kind == "container"):
            if target.scaler != self.scaler.name:
                continue
            count += self._apply_container_target(target, tracked)
        if self.network_isolation:
            for target in (t for t in plan if t.kind == "rule"):
                if self._remove_rules_quietly(target.target, (), "stale rule set"):
                    count += 1
        return count

    def _apply_container_target(self, target: OrphanTarget, tracked: set[str]) -> int:
        try:
            info = self.api.inspect_container(target.target)
        except NotFound:
            return 0
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get("kici-managed") != "true" or labels.get("kici-scaler-name") != self.scaler.name:
            return 0
        agent_id = labels.get("kici-agent-id") or ""
        if agent_id != target.agent_id or (agent_id and agent_id in tracked):
            return 0
        state = info.get("State") or {}
        alive = bool(state.get("Running") or state.get("Paused") or state.get("Restarting"))
        if alive:
            if not agent_id:
                return 0
            if self._is_registered is REGISTRY:
                if db_registered_ids([agent_id]):
                    return 0
            elif self._is_registered is None or self._is_registered(agent_id):
                return 0
        addresses = [
            ep.get("IPAddress")
            for name, ep in ((info.get("NetworkSettings") or {}).get("Networks") or {}).items()
            if name == ISOLATED_NETWORK_NAME and ep.get("IPAddress")
        ]
        if alive:
            try:
                self.api.stop(target.target, timeout=ORPHAN_STOP_TIMEOUT_SECONDS)
            except Exception:  # noqa: BLE001 - stop errors are ignored (SPEC (e))
                pass
        try:
            removed = self._remove_container(target.target)
        except APIError:
            log.warning("could not remove orphan %s", target.target[:12], exc_info=True)
            return 0
        for address in addresses:
            self._remove_rules_quietly(address, (target.target, agent_id), f"orphan container {target.target[:12]}")
        return 1 if removed else 0

    def _addresses(self, summary: dict) -> list[str]:
        return container_addresses(summary)

    def _remove_rules_unless_held(self, address: str, exclude, why: str) -> bool:
        """Delete ``address``'s rules unless a sandbox other than ``exclude`` (ids of the one
        going away) holds it now: any active agent row, any kici-managed container on this
        runtime, any VM allocation (``scalers.backends.holders``). True when deleted."""
        removed, _ = self.isolation.remove_unless_held(
            address, exclude=exclude, list_containers=self.list_managed, why=why
        )
        return removed

    def _remove_rules_quietly(self, address: str, exclude=(), why: str = "") -> bool:
        """:meth:`_remove_rules_unless_held`, logging instead of raising (the reaper is the backstop)."""
        if not self.network_isolation:
            return False
        try:
            return self._remove_rules_unless_held(address, exclude, why)
        except Exception:  # noqa: BLE001
            log.warning("could not remove rules for %s", address, exc_info=True)
            return False

    def cleanup_orphans(self) -> int:
        """``apply_orphans(plan_orphans())`` (SPEC (e) ``cleanupOrphans``): containers + rule sets removed."""
        return self.apply_orphans(self.plan_orphans())

    def reap_unowned_isolation_rules(self) -> int:
        """Delete rules for ``kici-agent-net`` addresses nothing holds (``holders``: kici-managed
        containers of ALL scalers and consoles, active agent rows, VM allocations); reaps nothing
        when the runtime or the table cannot be listed. The candidates are locked and re-checked
        with a fresh listing before one nft transaction deletes them. Returns the count."""
        if not self.network_isolation:
            return 0
        try:
            live = set(read_holders(containers=self.list_managed()))
        except Exception:  # noqa: BLE001
            log.warning("rule reap skipped: the runtime could not be listed", exc_info=True)
            return 0
        candidates = [a for a in (self.isolation.addresses_with_rules() or []) if a not in live]
        if not candidates:
            return 0
        with address_lock(*candidates):
            try:
                held = read_holders(candidates, list_containers=self.list_managed)
            except Exception:  # noqa: BLE001
                log.warning("rule reap skipped: the holders could not be re-read", exc_info=True)
                return 0
            return len(self.isolation.reap({a for a, h in held.items() if h}, only=candidates))
