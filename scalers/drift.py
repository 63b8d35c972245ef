"""The isolation drift check: the rules in the kernel against the active agents in the database,
every sweeper round; what differs is re-applied in one transaction after re-reading the rows, so
an agent torn down meanwhile is not given rules back, and an agent whose sandbox is provably gone
is reported, not repaired. Design: docs/nft-isolation.md ("The drift check").
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from agents.choices import ACTIVE_STATES, AgentState, EventType
from agents.events import record_event
from agents.liveness import GONE_SANDBOX_STATES
from agents.models import Agent, ScalerEvent
from network.nft.apply import AgentRules, NftClient, elements_to_replace
from network.nft.plan import spec_rule_lines
from network.nft.render import render_agents, render_table_base
from network.nft.spec import AgentSpec, RuleSpecError

from .backends import factory
from .backends.holders import address_lock
from .backends.sandboxes import probe_sandboxes
from .choices import ScalerType
from .metrics import REPAIRS, add_to_counters, counter_increment
from .models import Scaler

log = logging.getLogger(__name__)

#: How the event of an agent in drift whose sandbox is gone begins (recorded once per agent).
NOT_RESTORED = "isolation rules not restored"
#: Agent states whose rules the check restores: every active one but destroying (its rules are going away).
KEPT_STATES = tuple(s for s in ACTIVE_STATES if s != AgentState.DESTROYING)


@dataclass
class _Table:
    client: NftClient
    bridges: set[str] = field(default_factory=set)
    networks: set[str] = field(default_factory=set)
    agents: dict[str, tuple[Agent, AgentSpec]] = field(default_factory=dict)


@dataclass
class DriftReport:
    """One table's check: ``base`` problems found (lines), ``agents`` repaired (agent ids),
    ``gone``: agents in drift left alone because their sandbox is provably gone (agent ids)."""

    table: str
    base: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


def agent_drift(spec: AgentSpec, found: AgentRules | None) -> str | None:
    """Why the kernel's rules for ``spec``'s address differ from ``spec`` (one line), or None."""
    if found is None:
        return "no rules in the kernel"
    if not found.complete:
        return "its chains or map elements are missing"
    if spec.port and (spec.port, spec.mac) not in found.bindings:
        return f"its port {spec.port} with MAC {spec.mac} is not bound"
    if spec.port and spec.port in found.unguarded_ports:
        return f"its port {spec.port} is missing from the guarded agent ports"
    if found.rule_lines() != spec_rule_lines(spec):
        return "its rules differ from its policy"
    return None


def gone_sandboxes(agents: list[Agent]) -> dict[str, str]:
    """``agent_id`` → why (``container missing (no such container on the runtime)``) for those of
    ``agents`` whose sandbox is provably gone; one probe per scaler. An unreachable runtime
    proves nothing (``unknown``), so its agents are not in the answer."""
    by_scaler: dict[int, list[Agent]] = defaultdict(list)
    for agent in agents:
        by_scaler[agent.scaler_id].append(agent)
    gone = {}
    for scaler in Scaler.objects.filter(pk__in=by_scaler):
        for agent_id, probe in probe_sandboxes(scaler, by_scaler[scaler.pk]).items():
            if probe.state in GONE_SANDBOX_STATES:
                gone[agent_id] = f"{probe.what} {probe.state}" + (f" ({probe.detail})" if probe.detail else "")
    return gone


def _tables() -> dict[str, _Table]:
    """The tables this host's scalers use, with their bridges and the expected specs of their
    active agents (another host's table is in its kernel, checked by its own sweeper)."""
    tables: dict[str, _Table] = {}
    for scaler in Scaler.objects.on_this_host().filter(retiring=False).exclude(type=ScalerType.EVENT):
        try:
            target = getattr(factory.get_backend(scaler), "isolation_target", lambda: None)()
        except Exception as exc:  # noqa: BLE001 - one scaler's runtime down must not stop the others
            log.warning("drift check: scaler %s skipped: %s", scaler.name, exc)
            continue
        if target is None:
            continue
        entry = tables.setdefault(target.client.table, _Table(target.client))
        entry.bridges.update(target.bridges)
        entry.networks.update(target.networks)
        agents = Agent.objects.filter(scaler=scaler, state__in=KEPT_STATES).exclude(ip=None).select_related("label_set")
        for agent in agents:
            try:
                spec = target.spec_for(agent)
            except RuleSpecError as exc:
                log.warning("drift check: %s has rules that cannot be rendered: %s", agent.agent_id, exc)
                continue
            if spec is not None:
                entry.agents[str(spec.address)] = (agent, spec)
    return tables


def check_isolation_drift() -> list[DriftReport]:
    """Compare and repair every table in use (see the module doc); the reports of tables that
    needed a repair. A table whose listing fails is logged and left for the next round."""
    reports = []
    for name, table in _tables().items():
        try:
            report = _check_table(name, table)
        except Exception:  # one table's failure must not stop the others
            log.exception("drift check of table %s failed", name)
            continue
        if report.base or report.agents:
            reports.append(report)
    return reports


def _check_table(name: str, table: _Table) -> DriftReport:
    client = table.client
    bridges, networks = sorted(table.bridges), sorted(table.networks)
    found, base, unused = client.snapshot(bridges)
    drifted = {
        addr: why for addr, (_, spec) in table.agents.items() if (why := agent_drift(spec, found.get(spec.address)))
    }
    report = DriftReport(name, base=base)
    gone = gone_sandboxes([table.agents[a][0] for a in drifted]) if drifted else {}
    told = set(
        ScalerEvent.objects.filter(
            agent__agent_id__in=list(gone), type=EventType.NETWORK, detail__startswith=NOT_RESTORED
        ).values_list("agent__agent_id", flat=True)
    )
    for addr in [a for a in drifted if table.agents[a][0].agent_id in gone]:
        agent = table.agents[addr][0]
        why = f"{drifted.pop(addr)}, and its {gone[agent.agent_id]}"
        log.info("isolation rules of %s (%s) not restored: %s", agent.agent_id, addr, why)
        if agent.agent_id not in told:  # once: the sweeper runs every few seconds until it is released
            record_event(
                agent,
                EventType.NETWORK,
                f"{NOT_RESTORED}: {why}; its sandbox is gone, the lost-agents sweep releases it",
            )
        report.gone.append(agent.agent_id)
    if not base and not drifted:
        client.delete_unused_policy_chains(unused)
        return report
    with address_lock(*drifted):
        # Re-read under the locks: a teardown that began since the listing keeps its rules gone.
        still = set(
            Agent.objects.filter(pk__in=[table.agents[a][0].pk for a in drifted], state__in=KEPT_STATES).values_list(
                "pk", flat=True
            )
        )
        repair = [table.agents[a] for a in drifted if table.agents[a][0].pk in still]
        specs = [spec for _, spec in repair]
        replace = {spec.address: elements_to_replace(spec, found.get(spec.address)) for spec in specs}
        base_cmds = render_table_base(name, bridges, networks, client.host_networks())
        client.apply_document(base_cmds + render_agents(name, specs, replace))
        increments: dict = {}
        if base:
            increments |= counter_increment(REPAIRS, {"table": name, "kind": "base"})
            log.warning("isolation base of table %s re-applied: %s", name, "; ".join(base))
        if repair:
            increments |= counter_increment(REPAIRS, {"table": name, "kind": "agent"}, len(repair))
        add_to_counters(increments)
        scalers: dict[str, list[str]] = defaultdict(list)
        for agent, spec in repair:
            why = drifted[str(spec.address)]
            log.warning("isolation rules of %s (%s) re-applied: %s", agent.agent_id, spec.address, why)
            record_event(agent, EventType.NETWORK, f"isolation rules re-applied from the database: {why}")
            scalers[agent.scaler.name].append(agent.agent_id)
            report.agents.append(agent.agent_id)
        if base:
            record_event(
                None,
                EventType.NETWORK,
                f"isolation base of table {name} re-applied: {'; '.join(base)}",
                scaler_name=",".join(sorted(scalers)) or "",
            )
    client.delete_unused_policy_chains(unused)
    return report
