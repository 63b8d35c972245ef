"""Sweeping a scaler's containers and rules: orphans planned with evidence and re-checked before
removal, refused registrations, unowned rule sets (the rule is :mod:`scalers.backends.container.orphans`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from docker.errors import APIError, NotFound

from ..docker_net import ISOLATED_NETWORK_NAME, container_addresses
from ..holders import address_lock, read_holders
from ..orphans import OrphanTarget
from ..ownership import MINE, Owner, judge_ownership
from .host import DockerHost, agent_filters
from .orphans import (
    ALIVE_STATES,
    ContainerPlan,
    TrackedAgent,
    judge_container,
    plan_container_orphans,
    plan_rule_orphans,
    summary_of_inspect,
)
from .rules import ContainerRuleWriter
from .tracked import FROM_DATABASE, db_registered_ids

log = logging.getLogger(__name__)

ORPHAN_STOP_TIMEOUT_SECONDS = 5


def registry_probe(is_registered: Any, candidates: Iterable[str]) -> Callable[[str], bool] | None:
    """The registry probe for a set of agent ids: ``is_registered`` itself (a callable, or None for
    unwired), or for :data:`~scalers.backends.container.tracked.FROM_DATABASE` one batched database
    lookup of ``candidates``."""
    if is_registered is FROM_DATABASE:
        return db_registered_ids([c for c in candidates if c]).__contains__
    return is_registered


def reap_unowned(host: DockerHost, rules: ContainerRuleWriter, owner: Owner, agent_id: str) -> bool:
    """Force-remove the scaler's containers for one agent id (a refused registration).

    Lists by ``kici-managed=true``, own ``kici-scaler-name`` and ``kici-agent-id``, and removes
    only those whose ownership labels are all ``owner``'s (another console's, or one of unknown
    ownership, is left); True when one was removed; a listing error answers False.
    """
    scaler_name = owner.scaler_name
    if not agent_id or not scaler_name.strip():
        return False
    try:
        found = host.list(agent_filters(scaler_name, agent_id))
    except Exception:
        log.warning("reap_unowned(%s): listing failed", agent_id, exc_info=True)
        return False
    removed = False
    for summary in found:
        labels = summary.get("Labels") or {}
        if labels.get("kici-scaler-name") != scaler_name or labels.get("kici-agent-id") != agent_id:
            continue
        ownership = judge_ownership(labels, owner)
        if ownership.ownership != MINE:
            log.warning("reap_unowned(%s): container %s left: %s", agent_id, summary["Id"][:12], ownership.reason)
            continue
        for address in container_addresses(summary):
            rules.remove_quietly(address, (summary["Id"], agent_id), f"refused registration of {agent_id}")
        removed = host.remove(summary["Id"]) or removed
    return removed


def plan_containers(
    summaries: list[dict], owner: Owner, tracked: Mapping[str, TrackedAgent], is_registered: Any
) -> ContainerPlan:
    """The container verdicts on one listing for ``owner`` (``orphans.plan_container_orphans``), the
    registry asked once for the scaler's live containers. Raises ``OrphanSweepRefused`` for a blank
    scaler name."""
    candidates = [
        (s.get("Labels") or {}).get("kici-agent-id", "")
        for s in summaries
        if (s.get("Labels") or {}).get("kici-scaler-name") == owner.scaler_name
        and str(s.get("State", "")).lower() in ALIVE_STATES
    ]
    return plan_container_orphans(summaries, owner, tracked, registry_probe(is_registered, candidates))


def plan_rules(host: DockerHost, rules: ContainerRuleWriter, scaler_name: str, summaries: list[dict] | None = None):
    """Rule sets on ``kici-agent-net`` addresses that nothing holds (``scalers.backends.holders``).

    ``summaries``: a listing already made, else one is made; a failed listing plans nothing.
    """
    if summaries is None:
        try:
            summaries = host.list_managed()
        except Exception:
            log.warning("rule reap skipped: the runtime could not be listed", exc_info=True)
            return []
    live = set(read_holders(containers=summaries))
    isolation = rules.isolation
    return plan_rule_orphans(isolation.addresses_with_rules(), live, scaler_name, isolation.table)


def apply_container_target(
    host: DockerHost,
    rules: ContainerRuleWriter,
    target: OrphanTarget,
    owner: Owner,
    tracked: Mapping[str, TrackedAgent],
    is_registered: Any,
) -> int:
    """Stop and remove one planned container if the rule still calls it ``owner``'s orphan; 1 when
    removed.

    The container is inspected afresh and judged by the same rule as the plan (and must still be
    the same agent's); one that vanished meanwhile is skipped without error.
    """
    if target.scaler != owner.scaler_name:
        return 0
    try:
        info = host.api.inspect_container(target.target)
    except NotFound:
        return 0
    summary = summary_of_inspect(info)
    agent_id = (summary["Labels"] or {}).get("kici-agent-id") or ""
    if agent_id != target.agent_id:
        return 0
    probe = (lambda a: bool(db_registered_ids([a]))) if is_registered is FROM_DATABASE else is_registered
    verdict = judge_container(summary, owner, tracked, probe)
    if not isinstance(verdict, OrphanTarget):
        return 0
    addresses = [
        ep.get("IPAddress")
        for name, ep in ((info.get("NetworkSettings") or {}).get("Networks") or {}).items()
        if name == ISOLATED_NETWORK_NAME and ep.get("IPAddress")
    ]
    if summary["State"] in ALIVE_STATES:
        try:
            host.api.stop(target.target, timeout=ORPHAN_STOP_TIMEOUT_SECONDS)
        except Exception:  # noqa: BLE001 - stop errors are ignored
            pass
    try:
        removed = host.remove(target.target)
    except APIError:
        log.warning("could not remove orphan %s", target.target[:12], exc_info=True)
        return 0
    for address in addresses:
        rules.remove_quietly(address, (target.target, agent_id), f"orphan container {target.target[:12]}")
    return 1 if removed else 0


def apply_orphans(
    host: DockerHost,
    rules: ContainerRuleWriter,
    owner: Owner,
    plan: list[OrphanTarget],
    tracked: Mapping[str, TrackedAgent],
    is_registered: Any,
) -> int:
    """Remove what ``plan`` names, re-checking each target first; returns containers + rule sets removed.

    Containers: :func:`apply_container_target`, for the targets of ``owner``'s scaler only. A rule set
    is deleted only if nothing holds its address now (``holders.remove_unless_held``: a fresh
    listing under the address's lock; a failed listing deletes none).
    """
    count = 0
    for target in (t for t in plan if t.kind == "container"):
        count += apply_container_target(host, rules, target, owner, tracked, is_registered)
    if rules.enabled:
        for target in (t for t in plan if t.kind == "rule"):
            if rules.remove_quietly(target.target, (), "stale rule set"):
                count += 1
    return count


def reap_unowned_isolation_rules(host: DockerHost, rules: ContainerRuleWriter) -> int:
    """Delete rules for ``kici-agent-net`` addresses nothing holds (``holders``: kici-managed
    containers of ALL scalers and consoles, active agent rows, VM allocations); reaps nothing
    when the runtime or the table cannot be listed. The candidates are locked and re-checked
    with a fresh listing before one nft transaction deletes them. Returns the count."""
    if not rules.enabled:
        return 0
    try:
        live = set(read_holders(containers=host.list_managed()))
    except Exception:
        log.warning("rule reap skipped: the runtime could not be listed", exc_info=True)
        return 0
    candidates = [a for a in (rules.isolation.addresses_with_rules() or []) if a not in live]
    if not candidates:
        return 0
    with address_lock(*candidates):
        try:
            held = read_holders(candidates, list_containers=host.list_managed)
        except Exception:
            log.warning("rule reap skipped: the holders could not be re-read", exc_info=True)
            return 0
        return len(rules.isolation.reap({a for a, h in held.items() if h}, only=candidates))
