"""Reap orphan containers of one container scaler (or a bare-metal one's container-mode agents). The
rule is the backend's, written once (``scalers.backends.container.orphans.judge_container``); the
run re-plans and judges each container once more right before removing it. Design:
docs/sandbox-ownership.md and docs/operations.md ("orphan-containers").
"""

from __future__ import annotations

import time

from agents.models import Agent
from scalers.models import Scaler

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, Spared, Target, require_scaler
from .reaping import act_on_planned, backend_for, owner_instance

TYPES = ("container", "bare-metal")


def _runs_containers(scaler) -> bool:
    """A container scaler, or a bare-metal one with a label set in container mode (image, no binaryPath)."""
    if scaler.type == "container":
        return True
    return any(
        (ls.config or {}).get("image") and not (ls.config or {}).get("binaryPath")
        for ls in scaler.label_sets.filter(retired=False)
    )


def _agent_rows(agent_ids):
    return {a.agent_id: a for a in Agent.objects.filter(agent_id__in=[a for a in agent_ids if a])}


def _created_age(summary: dict) -> int | None:
    created = summary.get("Created")
    if isinstance(created, (int, float)) and created > 0:
        return max(0, int(time.time() - created))
    return None


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
        return [Scope(scaler=s) for s in Scaler.objects.filter(type__in=TYPES) if _runs_containers(s)]

    def plan(self, scope: Scope) -> Plan:
        scaler = scope.scaler
        backend = backend_for(scaler)
        verdicts = backend.plan_containers()  # raises when the runtime cannot be listed: nothing is planned blind
        rules = verdicts.rules
        by_id = verdicts.summaries
        rows = _agent_rows([t.agent_id for t in verdicts.targets] + [s.agent_id for s in verdicts.spared])
        result = Plan(context={})
        for t in verdicts.targets:
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
                "owner_instance": owner_instance(agent, t.evidence.get("labels")),
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
        for s in verdicts.spared:
            agent = rows.get(s.agent_id)
            summary = by_id.get(s.container_id, {})
            evidence = {
                "agent_id": s.agent_id or None,
                "container_state": s.state,
                "agent_row": agent.state if agent else "none",
                "registered": bool(agent and agent.registered_at and agent.is_active),
                "owner_instance": owner_instance(agent, summary.get("Labels")),
                "age_seconds": _created_age(summary),
            }
            result.spared.append(
                Spared(f"container:{s.container_id}", s.name or s.container_id[:12], s.reason, evidence)
            )
        if rules:
            result.notes.append(
                f"{len(rules)} stale isolation rule set(s) on this host are planned separately (stale-isolation-rules)"
            )
        return result

    def act(self, run, scope, plan, targets) -> None:
        act_on_planned(run, scope, plan, targets, _remove)
