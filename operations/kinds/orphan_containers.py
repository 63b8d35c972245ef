"""Reap orphan containers of one container scaler.

The rules are the backend's (``scalers.backends.orphans``): only containers stamped with this
scaler's own name, never one whose agent this console tracks, and a running one only when its
agent is not registered. The plan is the backend's ``plan_orphans()``; the preview also lists
every other container of this scaler with the reason it is spared. The run re-plans; a container
whose agent registered (or became tracked) since the preview is not in the fresh plan and is
skipped with that reason, and ``apply_orphans`` re-checks each container once more right before
stopping and removing it.

Scope: one ``container`` scaler, or a ``bare-metal`` scaler with container-mode label sets (its agent
containers carry the same labels). Stale isolation rules are a separate kind
(``stale-isolation-rules``).
"""

from __future__ import annotations

import time

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, Spared, Target, require_scaler
from .reaping import act_on_planned, backend_for

TYPES = ("container", "bare-metal")


def _runs_containers(scaler) -> bool:
    """A container scaler, or a bare-metal one with a label set in container mode (image, no binaryPath)."""
    if scaler.type == "container":
        return True
    return any(
        (ls.config or {}).get("image") and not (ls.config or {}).get("binaryPath")
        for ls in scaler.label_sets.filter(retired=False)
    )


def _list_managed(backend) -> list[dict]:
    containers = backend if hasattr(backend, "list_managed") else getattr(backend, "containers", None)
    return containers.list_managed() if containers is not None else []


def _agent_rows(agent_ids):
    from agents.models import Agent

    return {a.agent_id: a for a in Agent.objects.filter(agent_id__in=[a for a in agent_ids if a])}


def _created_age(summary: dict) -> int | None:
    created = summary.get("Created")
    if isinstance(created, (int, float)) and created > 0:
        return max(0, int(time.time() - created))
    return None


def _spared_reason(summary: dict, agent, scaler_name: str) -> str:
    from scalers.backends.orphans import ALIVE_STATES, SKIP_STATES

    labels = summary.get("Labels") or {}
    state = str(summary.get("State") or "").lower()
    agent_id = labels.get("kici-agent-id") or ""
    if state in SKIP_STATES:
        return f"being removed by the runtime ({state})"
    if agent is not None and agent.is_active and agent.scaler.name == scaler_name:
        registered = " and registered" if agent.registered_at else ""
        if state not in ALIVE_STATES and agent.state in ("running", "draining"):
            # its agent is lost: released (with this container) by a lost-agents operation
            return f"tracked: agent {agent_id} is {agent.state}{registered}, but its container is {state or 'gone'}: see lost-agents"
        return f"tracked: agent {agent_id} is {agent.state}{registered}"
    if state in ALIVE_STATES:
        if not agent_id:
            return f"{state} with no kici-agent-id label: cannot tell whose it is"
        return f"{state} and agent {agent_id} is registered"
    return "not planned by the backend"


def _remove(backend, orphan, target) -> tuple[TargetOutcome, str]:
    if backend.apply_orphans([orphan]):
        return TargetOutcome.DONE, "stopped and removed" if target.evidence.get("container_state") in (
            "running",
            "paused",
            "restarting",
        ) else "removed"
    return TargetOutcome.SKIPPED, "the backend's last re-check declined: tracked, registered or already gone"


class OrphanContainers(Kind):
    name = OperationKind.ORPHAN_CONTAINERS
    volatile = frozenset({"status", "age_seconds"})
    swept = True

    def validate_scope(self, scope: Scope) -> None:
        require_scaler(scope, TYPES, "an orphan-container reap")

    def sweep_scopes(self) -> list[Scope]:
        from scalers.models import Scaler

        return [Scope(scaler=s) for s in Scaler.objects.filter(type__in=TYPES) if _runs_containers(s)]

    def plan(self, scope: Scope) -> Plan:
        scaler = scope.scaler
        backend = backend_for(scaler)
        planned = backend.plan_orphans()  # raises when the runtime cannot be listed: nothing is planned blind
        containers = [t for t in planned if t.kind == "container"]
        rules = [t for t in planned if t.kind == "rule"]
        try:
            summaries = _list_managed(backend)
        except Exception:  # noqa: BLE001 - the spared list is informational
            summaries = []
        by_id = {s["Id"]: s for s in summaries}
        mine = [s for s in summaries if (s.get("Labels") or {}).get("kici-scaler-name") == scaler.name]
        rows = _agent_rows(
            [t.agent_id for t in containers] + [(s.get("Labels") or {}).get("kici-agent-id", "") for s in mine]
        )
        result = Plan(context={})
        for t in containers:
            agent = rows.get(t.agent_id)
            summary = by_id.get(t.target, {})
            evidence = {
                "agent_id": t.agent_id or None,
                "container": t.evidence.get("name"),
                "container_state": t.evidence.get("state"),
                "status": t.evidence.get("status"),
                "tracked": False,
                "registered": bool(agent and agent.registered_at and agent.is_active),
                "agent_row": agent.state if agent else "none",
                "owner_instance": (agent.owner_instance or None) if agent else None,
                "addresses": t.evidence.get("addresses", []),
                "labels": t.evidence.get("labels", {}),
                "age_seconds": _created_age(summary),
                "why": t.reason,
            }
            key = f"container:{t.target}"
            result.targets.append(
                Target(key, "stop and remove container", t.evidence.get("name") or t.target[:12], evidence)
            )
            result.context[key] = t
        planned_ids = {t.target for t in containers}
        for s in mine:
            if s["Id"] in planned_ids:
                continue
            labels = s.get("Labels") or {}
            agent = rows.get(labels.get("kici-agent-id", ""))
            name = ((s.get("Names") or [""])[0] or "").lstrip("/") or s["Id"][:12]
            evidence = {
                "agent_id": labels.get("kici-agent-id") or None,
                "container_state": str(s.get("State") or "").lower(),
                "agent_row": agent.state if agent else "none",
                "registered": bool(agent and agent.registered_at and agent.is_active),
                "age_seconds": _created_age(s),
            }
            result.spared.append(Spared(f"container:{s['Id']}", name, _spared_reason(s, agent, scaler.name), evidence))
        if rules:
            result.notes.append(
                f"{len(rules)} stale isolation rule set(s) on this host are planned separately (stale-isolation-rules)"
            )
        return result

    def act(self, run, scope, plan, targets) -> None:
        act_on_planned(run, scope, plan, targets, _remove)
