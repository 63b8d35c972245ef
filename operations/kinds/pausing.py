"""Pause and resume a scaler, or every scaler of one host (``scalers.pauses``): a pause stops
admission for its scope and may drain its agents; a resume removes it. Parameters and targets:
docs/operations.md ("pause and resume").
"""

from __future__ import annotations

from agents.choices import AgentState
from agents.models import Agent
from lib.wording import json_text
from scalers.lifecycle import mark_draining
from scalers.models import Pause as PauseRow
from scalers.pauses import known_hosts, lift_pause, pause_json, pause_wording, reason_problem, set_pause

from ..choices import OperationKind, TargetOutcome
from ..models import Operation
from .base import Kind, Plan, Scope, ScopeInvalid, Spared, Target


def _host(scope: Scope) -> str:
    return (scope.params.get("host") or "").strip()


def _check_where(scope: Scope, what: str) -> None:
    """ScopeInvalid naming the field unless the scope is one scaler or one known host."""
    host = scope.params.get("host")
    if host is not None and not isinstance(host, str):
        raise ScopeInvalid("host", f"must be a host name, got {json_text(host)}")
    host = _host(scope)
    if scope.scaler is None and not host:
        raise ScopeInvalid("scaler", f"{what} needs a scaler or a host")
    if scope.scaler is not None and host:
        raise ScopeInvalid(
            "host", f"{what} takes a scaler or a host, not both (scaler {scope.scaler.name!r}, host {json_text(host)})"
        )
    if host and host not in (hosts := known_hosts()):
        raise ScopeInvalid(
            "host", f"no scaler belongs to host {json_text(host)}; known hosts: {', '.join(hosts) or 'none'}"
        )


def _where(scope: Scope) -> tuple[str, str, dict]:
    """The target's key and subject, and the filter of its pause row."""
    host = _host(scope)
    if host:
        return f"host:{host}", f"host {host}", {"host": host, "scaler": None}
    return f"scaler:{scope.scaler.name}", f"scaler {scope.scaler.name}", {"scaler": scope.scaler, "host": ""}


def _running(scope: Scope):
    agents = Agent.objects.filter(state=AgentState.RUNNING)
    host = _host(scope)
    return agents.filter(scaler__host=host) if host else agents.filter(scaler=scope.scaler)


def _who(operation_id: int) -> tuple[str, str]:
    """The requester's and the approver's user names of an operation ("policy" when auto-approved)."""
    op = Operation.objects.select_related("requested_by", "approved_by").get(pk=operation_id)
    requested = op.requested_by.get_username() if op.requested_by else "system"
    approved = "policy" if op.auto_approved else (op.approved_by.get_username() if op.approved_by else "")
    return requested, approved


class Pause(Kind):
    name = OperationKind.PAUSE
    params = ("host", "reason", "drain")
    volatile = frozenset({"running_agents"})

    def validate_scope(self, scope: Scope) -> None:
        _check_where(scope, "a pause")
        if problem := reason_problem(scope.params.get("reason")):
            raise ScopeInvalid("reason", problem)
        drain = scope.params.get("drain", False)
        if not isinstance(drain, bool):
            raise ScopeInvalid("drain", f"must be true or false, got {json_text(drain)}")

    def planned_by_host(self, scope: Scope) -> bool:
        return False

    def plan(self, scope: Scope) -> Plan:
        key, subject, row = _where(scope)
        result = Plan()
        drain = bool(scope.params.get("drain"))
        evidence = {
            "reason": scope.params["reason"].strip(),
            "drain": drain,
            "running_agents": _running(scope).count(),
        }
        current = PauseRow.objects.select_related("scaler").filter(**row).first()
        if current is not None:
            result.spared.append(Spared(key, subject, "already " + pause_wording(pause_json(current)), evidence))
            return result
        action = "pause and drain its running agents" if drain else "pause: no new agent"
        result.targets.append(Target(key, action, subject, evidence))
        if scope.scaler is not None and scope.scaler.host:
            host_pause = PauseRow.objects.filter(host=scope.scaler.host).first()
            if host_pause is not None:
                result.notes.append("its host is paused too: " + pause_wording(pause_json(host_pause)))
        return result

    def act(self, run, scope, plan, targets) -> None:
        requested, approved = _who(run.operation_id)
        for target in targets:
            try:
                _, new = set_pause(
                    scaler=scope.scaler,
                    host=_host(scope),
                    reason=scope.params["reason"],
                    requested_by=requested,
                    approved_by=approved,
                    operation=run.operation_id,
                    drain=bool(scope.params.get("drain")),
                )
            except Exception as exc:  # noqa: BLE001
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            if not new:
                run.report(target.key, TargetOutcome.SKIPPED, "already paused by another operation")
                continue
            detail = f"paused by {requested}" + (f", approved by {approved}" if approved else "")
            if scope.params.get("drain"):
                drained = sum(mark_draining(a) is not None for a in _running(scope).values_list("agent_id", flat=True))
                detail += f"; {drained} running agent(s) draining"
            run.report(target.key, TargetOutcome.DONE, detail)


class Resume(Kind):
    name = OperationKind.RESUME
    params = ("host",)

    def validate_scope(self, scope: Scope) -> None:
        _check_where(scope, "a resume")

    def planned_by_host(self, scope: Scope) -> bool:
        return False

    def plan(self, scope: Scope) -> Plan:
        key, subject, row = _where(scope)
        result = Plan()
        current = PauseRow.objects.select_related("scaler").filter(**row).first()
        if current is None:
            result.spared.append(Spared(key, subject, "not paused"))
            return result
        shown = pause_json(current)
        evidence = {"paused_by": shown["requestedBy"], "reason": shown["reason"], "operation": shown["operation"]}
        result.targets.append(Target(key, "resume: admit new agents again", subject, evidence))
        if scope.scaler is not None and scope.scaler.host:
            host_pause = PauseRow.objects.filter(host=scope.scaler.host).first()
            if host_pause is not None:
                result.notes.append("its host stays paused: " + pause_wording(pause_json(host_pause)))
        return result

    def act(self, run, scope, plan, targets) -> None:
        for target in targets:
            try:
                lifted = lift_pause(scaler=scope.scaler, host=_host(scope))
            except Exception as exc:  # noqa: BLE001
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            if lifted:
                run.report(target.key, TargetOutcome.DONE, "resumed: new agents are admitted again")
            else:
                run.report(target.key, TargetOutcome.SKIPPED, "no longer paused")
