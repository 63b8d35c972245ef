"""Reap orphan Firecracker VMs, chroots, TAPs and rules of one firecracker scaler. The passes and
their rules are the backend's (``scalers.backends.firecracker.orphans``), which re-checks every
target right before acting. Design: docs/sandbox-ownership.md ("Orphan VMs") and
docs/operations.md ("orphan-vms").
"""

from __future__ import annotations

from agents.models import Agent
from scalers.backends.firecracker.orphans import plan_orphans, spared_vms
from scalers.backends.firecracker.pidprobe import probe_vm_pid
from scalers.models import Scaler

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, Spared, Target, require_scaler
from .reaping import act_on_planned, backend_for, owner_instance

TYPES = ("firecracker",)

_ACTIONS = {
    "allocation": "release address, delete TAP, remove chroot",
    "chroot": "remove chroot",
    "tap": "delete interface",
    "rules": "delete rule set",
}


def target_key(t) -> str:
    if t.kind == "tap":
        return f"tap:{t.tap}"
    if t.kind == "rules":
        return f"rules:{t.ip}"
    return f"{t.kind}:{t.agent_id}"


def _probe(backend, agent_id: str | None) -> str | None:
    if not agent_id:
        return None

    p = probe_vm_pid(backend.chroot_dir(agent_id))
    return f"{p.reason}" + (f" (pid {p.pid})" if p.pid else "")


def _reap(backend, orphan, target) -> tuple[TargetOutcome, str]:
    why = backend.orphan_recheck(orphan)
    if why is not None:
        return TargetOutcome.SKIPPED, f"the backend's last re-check declined: {why}"
    backend.orphan_act(orphan)
    return TargetOutcome.DONE, "done"


class OrphanVms(Kind):
    name = OperationKind.ORPHAN_VMS
    swept = True

    def validate_scope(self, scope: Scope) -> None:
        require_scaler(scope, TYPES, "an orphan-VM reap")

    def sweep_scopes(self) -> list[Scope]:
        return [Scope(scaler=s) for s in Scaler.objects.filter(type__in=TYPES)]

    def plan(self, scope: Scope) -> Plan:
        backend = backend_for(scope.scaler)
        facts = backend.orphan_facts()  # raises when the tracked set cannot be read: never reap blind
        targets = plan_orphans(facts)
        rows = {
            a.agent_id: a
            for a in Agent.objects.filter(
                agent_id__in=[t.agent_id for t in targets if t.agent_id] + list(facts.chroot_ids)
            )
        }
        allocations = {r.vm_id: r for r in facts.allocations_before}
        result = Plan(context={})
        for t in targets:
            agent = rows.get(t.agent_id) if t.agent_id else None
            alloc = allocations.get(t.agent_id) if t.agent_id else None
            evidence = {
                "pass": t.pass_no,
                "agent_id": t.agent_id or None,
                "ip": t.ip,
                "tap": t.tap,
                "tracked": False,
                "pid_probe": _probe(backend, t.agent_id),
                "chroot": t.agent_id in facts.chroot_ids if t.agent_id else None,
                "allocation_owner": alloc.scaler_name if alloc else None,
                "agent_row": agent.state if agent else "none",
                "owner_instance": owner_instance(agent, facts.owners.get(t.agent_id) if t.agent_id else None),
                "why": t.reason,
            }
            key = target_key(t)
            result.targets.append(
                Target(key, _ACTIONS.get(t.kind, t.kind), t.agent_id or t.tap or t.ip or key, evidence)
            )
            result.context[key] = t
        for vm_id, reason in spared_vms(facts):
            agent = rows.get(vm_id)
            result.spared.append(
                Spared(
                    f"chroot:{vm_id}",
                    vm_id,
                    reason,
                    {
                        "pid_probe": _probe(backend, vm_id),
                        "agent_row": agent.state if agent else "none",
                        "owner_instance": owner_instance(agent, facts.owners.get(vm_id)),
                    },
                )
            )
        if facts.rule_ips is None:
            result.notes.append("the rule table could not be read: no rule is planned")
        return result

    def act(self, run, scope, plan, targets) -> None:
        act_on_planned(run, scope, plan, targets, _reap)
