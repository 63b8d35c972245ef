"""Reap stale isolation rules on ``kici-agent-net``: an address with rules in this console's table
that nothing holds (``scalers.backends.holders``). When the runtime or the table cannot be listed
nothing is planned: reaping blind is worse than leaving a stale rule. Scope: docs/operations.md
("stale-isolation-rules").
"""

from __future__ import annotations

from agents.models import Agent
from scalers.backends.base import scaler_option
from scalers.backends.holders import read_holders
from scalers.backends.isolation import nft_table_for
from scalers.backends.orphans import OrphanTarget
from scalers.models import Scaler

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, Spared, Target, require_scaler
from .reaping import act_on_planned, backend_for

TYPES = ("container",)


def _delete(backend, orphan, target) -> tuple[TargetOutcome, str]:
    if backend.apply_orphans([orphan]):
        return TargetOutcome.DONE, "deleted"
    return TargetOutcome.SKIPPED, "the backend's last re-check declined: the address is held now, or its rules are gone"


class StaleIsolationRules(Kind):
    name = OperationKind.STALE_ISOLATION_RULES
    swept = True

    def validate_scope(self, scope: Scope) -> None:
        require_scaler(scope, TYPES, "a stale-rule reap")

    def sweep_scopes(self) -> list[Scope]:
        seen = set()
        scopes = []
        for scaler in Scaler.objects.filter(type__in=TYPES).order_by("name"):
            runtime = scaler_option(scaler, "host") or scaler_option(scaler, "socketPath") or ""
            where = (scaler.host, nft_table_for(scaler), runtime)  # one scope per host's table
            if where not in seen:
                seen.add(where)
                scopes.append(Scope(scaler=scaler))
        return scopes

    def plan(self, scope: Scope) -> Plan:
        scaler = scope.scaler
        backend = backend_for(scaler)
        result = Plan(context={})
        if not getattr(backend, "network_isolation", True):
            result.notes.append(f"network isolation is off for {scaler.name}: it writes no rules")
            return result
        table = backend.isolation.table
        try:
            summaries = backend.list_managed()
        except Exception as exc:  # noqa: BLE001
            result.notes.append(f"the container runtime could not be listed ({exc}): nothing is planned")
            return result
        with_rules = backend.isolation.addresses_with_rules()
        if with_rules is None:
            result.notes.append(f"table {table} could not be read: nothing is planned")
            return result
        holders = read_holders(with_rules, containers=summaries)
        rows: dict[str | None, list[Agent]] = {}
        for agent in Agent.objects.filter(ip__in=with_rules).order_by("created_at"):
            rows.setdefault(agent.ip, []).append(agent)
        for address in with_rules:
            agents = rows.get(address, [])
            held = [str(h) for h in holders.get(address, [])]
            last = agents[-1] if agents else None
            evidence = {
                "address": address,
                "table": table,
                "address_holders": held,
                "last_agent": f"{last.agent_id} ({last.state})" if last else None,
            }
            key = f"rules:{table}:{address}"
            if held:
                result.spared.append(Spared(key, address, "held by " + ", ".join(held), evidence))
                continue
            result.targets.append(Target(key, "delete rule set", address, evidence))
            result.context[key] = OrphanTarget(
                "rule",
                address,
                scaler.name,
                "",
                f"rules in table {table} for {address}, which no container holds",
                {"table": table, "address": address},
            )
        return result

    def act(self, run, scope, plan, targets) -> None:
        act_on_planned(run, scope, plan, targets, _delete)
