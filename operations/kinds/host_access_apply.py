"""Apply a host-access change: set a label set's ``networkPolicy.hostAccess`` (an explicit list, the
default, or back to the file) and re-write the input rules of its live agents; a host-access
change applies only through an approved operation. The preview diffs the rules read back from the
kernel, not what should be, and a value set here is a console override the imports keep. Scope,
targets and the run: docs/operations.md ("host-access-apply").
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.models import Agent
from lib.wording import json_text, listed
from network.host_access import (
    HostAccessError,
    console_port_warning,
    host_access_warnings,
    parse_host_access_entry,
    same_host_access,
    tcp_listening,
)
from network.netlink import NetlinkError, host_addresses
from network.nft.apply import NftClient
from network.nft.plan import line_diff, spec_rule_lines
from network.nft.spec import AgentSpec
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_SUBNET
from scalers.backends.firecracker.settings import NETWORK_DEFAULTS
from scalers.backends.holders import address_holders, address_lock
from scalers.backends.isolation import console_services, label_set_host_access, nft_table_for
from scalers.backends.sandboxes import list_kici_containers
from scalers.kici_orchestrator import kici_agent_target
from scalers.models import ConfigState, LabelSet

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, ScopeInvalid, Spared, Target

LIVE_STATES = (AgentState.SPAWNING, AgentState.CONNECTING, AgentState.RUNNING, AgentState.DRAINING)


def isolation_target(scaler) -> tuple[str, str, str] | None:
    """``(table, gateway, subnet)`` of the isolation rules of ``scaler``'s agents, or None when the
    console writes none (event scalers: the machines are someone else's).

    Container and bare-metal agents sit on ``kici-agent-net`` (172.30.0.0/16, gateway 172.30.0.1) in
    the scaler's ``nftTable`` else ``KICI_NFT_TABLE``; Firecracker VMs on the ``firecracker`` block's
    cidr/gateway/table.
    """
    if scaler.type in ("container", "bare-metal"):
        return nft_table_for(scaler), ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_SUBNET
    if scaler.type == "firecracker":
        net = {**NETWORK_DEFAULTS, **(ConfigState.load().firecracker or {})}
        return str(net["table"]), str(net["gateway"]), str(ipaddress.ip_network(str(net["cidr"]), strict=False))
    return None


def resolved_host_access(host_access: list[str] | None, label_set, gateway: str) -> list[str]:
    """The host access in force for an agent of ``label_set`` when it says ``host_access`` (None =
    the default: gateway DNS, the console port, host services; for a label set running the real
    KiCI agent, its orchestrator's port: ``scalers.backends.isolation.label_set_host_access``)."""
    return label_set_host_access(
        label_set, host_access, label_set.scaler.orchestrator_url or settings.KICI_CONSOLE_URL, gateway
    )


def _checked_entries(host_access: list[str] | None, label_set, gateway: str) -> list[str]:
    """The entries whose warnings an approver must confirm: the explicit list, or the default list
    when ``host_access`` is None."""
    return list(host_access) if host_access is not None else resolved_host_access(None, label_set, gateway)


def _warnings(entries: list[str], gateway: str) -> list[str]:
    """``network.host_access.host_access_warnings`` of ``entries`` against this host's addresses,
    the agents' gateway and the console's backing services (the editor warns about the same
    entries). When the addresses cannot be listed, that is itself a warning: the entries could not
    be checked."""
    address = ipaddress.ip_address(gateway)
    try:
        known = [*host_addresses(), address]
    except NetlinkError as exc:
        return [f"this host's addresses could not be listed ({exc}): the entries were not checked against them"]
    listening = tcp_listening()
    return host_access_warnings(entries, known, console_services(listening), gateway=address, listening=listening)


def _policy(label_set) -> dict:
    return dict((label_set.config or {}).get("networkPolicy") or {})


def _spec(agent, gateway: str, policy: dict, host_access: list[str]):
    return AgentSpec.build(
        agent.ip,
        gateway,
        allowlist=list(policy.get("allowlist") or []),
        deny_all=bool(policy.get("denyAll", False)),
        host_access=list(host_access),
    )


def _shown(host_access: list[str] | None) -> str:
    """A hostAccess value in a note or a report: ``[172.30.0.1:53, *:8000]``, ``[]``, ``(default)``."""
    return "(default)" if host_access is None else listed(host_access)


def _reverts(scope: Scope) -> bool:
    return scope.params.get("revert_to_file") is True


def _new_value(scope: Scope, label_set) -> list[str] | None:
    """The host access the run sets: the file's value on a revert, else ``params.host_access``."""
    return label_set.file_host_access if _reverts(scope) else scope.params["host_access"]


class HostAccessApply(Kind):
    name = OperationKind.HOST_ACCESS_APPLY
    atomic = True
    params = ("host_access", "revert_to_file")

    def validate_scope(self, scope: Scope) -> None:
        if scope.label_set is None:
            raise ScopeInvalid("label_set", "a host-access change needs a label set")
        revert = scope.params.get("revert_to_file", False)
        if revert not in (True, False):
            raise ScopeInvalid("revert_to_file", f"must be true or false, got {json_text(revert)}")
        if revert:
            if "host_access" in scope.params:
                raise ScopeInvalid("host_access", "give either a new list or revert_to_file, not both")
            return
        if "host_access" not in scope.params:
            raise ScopeInvalid(
                "host_access",
                "give the new list (one entry per line; an empty list is explicit) or ask for the default",
            )
        entries = scope.params["host_access"]
        if entries is None:
            return
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ScopeInvalid("host_access", f"must be a list of entries (strings), got {json_text(entries)}")
        for index, entry in enumerate(entries):
            try:
                parse_host_access_entry(entry)
            except HostAccessError as exc:
                # The entry's message names the entry; the field names its place.
                raise ScopeInvalid(f"host_access[{index}]", str(exc)) from None

    def plan(self, scope: Scope) -> Plan:
        label_set = LabelSet.objects.select_related("scaler").get(pk=scope.label_set.pk)
        revert = _reverts(scope)
        new = _new_value(scope, label_set)
        result = Plan()
        _plan_label_set(result, label_set, revert, new)
        _plan_agents(result, label_set, new)
        return result

    def act(self, run, scope, plan, targets) -> None:
        ordered = sorted(targets, key=lambda t: not t.key.startswith("labelset:"))
        label_set = LabelSet.objects.select_related("scaler").get(pk=scope.label_set.pk)
        revert = _reverts(scope)
        new = _new_value(scope, label_set)
        scaler = label_set.scaler
        for target in ordered:
            try:
                if target.key.startswith("labelset:"):
                    # The file's entry (config) is left as imported: it is what the pages show beside.
                    LabelSet.objects.filter(pk=label_set.pk).update(
                        host_access=new,
                        host_access_override=not revert,
                        host_access_override_operation=None if revert else run.operation_id,
                        host_access_override_at=None if revert else timezone.now(),
                    )
                    source = "the file's value" if revert else "console value, kept over the file"
                    run.report(
                        target.key,
                        TargetOutcome.DONE,
                        f"hostAccess = {_shown(new)} ({source})",
                    )
                    continue
                where = isolation_target(scaler)
                assert where is not None, "agent targets are planned only where the console writes rules"
                table, gateway, _ = where
                agent = Agent.objects.get(agent_id=target.subject)
                address = agent.ip
                assert address, "agent targets are planned only with an address, which is never cleared"
                resolved = target.evidence["host_access_new"]
                with address_lock(address):
                    others = address_holders(
                        address,
                        exclude=(agent.agent_id, agent.managed_id),
                        list_containers=lambda: list_kici_containers(scaler) or [],
                    )
                    if others:
                        run.report(
                            target.key,
                            TargetOutcome.SKIPPED,
                            f"address {agent.ip} is held by {', '.join(map(str, others))} now: writing this "
                            "agent's rules would replace theirs",
                        )
                        continue
                    NftClient(table, netns=settings.KICI_NFT_NETNS).apply_agent(
                        _spec(agent, gateway, _policy(label_set), resolved)
                    )
                summary = (
                    f"{len(target.evidence['rules_add'])} rule(s) added, {len(target.evidence['rules_remove'])} removed"
                )
                record_rules_rewrite(agent, resolved, new is not None, run.operation_id, summary)
                run.report(target.key, TargetOutcome.DONE, summary)
            except Exception as exc:  # noqa: BLE001
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")


def record_rules_rewrite(agent: Agent, host_access: list[str], explicit: bool, operation_id: int, summary: str):
    """Store ``agent``'s new resolved ``host_access`` (``explicit``: the label set's own list) once
    its rules were rewritten by operation ``operation_id``, and record it on its timeline as a
    ``scaler.network`` event "host access rewritten by operation #N: <entries> (<summary>)", in
    one transaction (the event's push re-renders the agent's open pages)."""
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(host_access=host_access, host_access_explicit=explicit)
        record_event(
            agent,
            EventType.NETWORK,
            detail=f"host access rewritten by operation #{operation_id}: {listed(host_access)} ({summary})",
            payload={"operation": operation_id, "hostAccess": list(host_access), "explicit": explicit},
        )


def _plan_label_set(result: Plan, label_set: LabelSet, revert: bool, new: list[str] | None) -> None:
    """Add the label set's own target (or why it is spared) and the note on the file's value to ``result``."""
    scaler = label_set.scaler
    key = f"labelset:{label_set.pk}"
    subject = f"{scaler.name}[{label_set.index}] {label_set.normalized}"
    file_value = label_set.file_host_access
    ls_evidence = {
        "host_access_from": label_set.host_access,
        "host_access_to": new,
        "source_from": "console" if label_set.host_access_override else "file",
        "source_to": "file" if revert else "console",
        "file_host_access": file_value,
        "scaler": scaler.name,
    }
    if revert and not label_set.host_access_override:
        result.spared.append(Spared(key, subject, "the label set already follows the file", ls_evidence))
    elif not revert and label_set.host_access_override and same_host_access(label_set.host_access, new):
        reason = "the label set already has this value"
        if label_set.host_access != new:
            reason += " (the same entries in another order or spelling, which allow the same)"
        result.spared.append(Spared(key, subject, reason, ls_evidence))
    else:
        if revert:
            action = "revert hostAccess to the file's value"
        elif new is None:
            action = "reset hostAccess to the default (console value)"
        else:
            action = "set hostAccess (console value)"
        result.targets.append(Target(key, action, subject, ls_evidence))
    shown = _shown(file_value)
    if revert:
        result.notes.append(
            f"scalers.yaml says hostAccess {shown} for this label set: it is in force from now on, "
            "and later edits of the file apply on import"
        )
    elif file_value != new:
        result.notes.append(
            f"scalers.yaml says hostAccess {shown} for this label set: the console's value stays in force "
            "over the file through restarts and reloads, shown beside the file's, until it is reverted to the file"
        )


def _plan_agents(result: Plan, label_set: LabelSet, new: list[str] | None) -> None:
    """Add each live agent's rule rewrite (or why it is spared) and the warnings on ``new`` to ``result``,
    against the rules the kernel has in force now."""
    scaler = label_set.scaler
    where = isolation_target(scaler)
    agents = list(Agent.objects.filter(label_set=label_set, state__in=LIVE_STATES).order_by("agent_id"))
    if where is None:
        if agents:
            result.notes.append(
                f"{scaler.type} agents run on machines this console does not firewall: no rules to change"
            )
        return
    table, gateway, _subnet = where
    checked = _checked_entries(new, label_set, gateway)
    # A real KiCI agent never dials the console: its list needs no console port.
    console = (
        None
        if kici_agent_target(label_set) is not None
        else console_port_warning(checked, scaler.orchestrator_url or settings.KICI_CONSOLE_URL, gateway)
    )
    result.warnings.extend(([console] if console else []) + _warnings(checked, gateway))
    try:
        in_force = NftClient(table, netns=settings.KICI_NFT_NETNS).list_agents()
    except Exception as exc:  # noqa: BLE001 - without the kernel's view, nothing is planned for agents
        in_force = None
        result.notes.append(f"could not read table {table}: {exc}; agent rules are not planned")
    policy = _policy(label_set)
    resolved_new = resolved_host_access(new, label_set, gateway)
    for agent in agents:
        akey = f"agent:{agent.agent_id}"
        if not agent.ip:
            result.spared.append(
                Spared(akey, agent.agent_id, "has no address yet (its rules are written when it gets one)")
            )
            continue
        if in_force is None:
            result.spared.append(Spared(akey, agent.agent_id, f"table {table} could not be read"))
            continue
        current = in_force.get(ipaddress.ip_address(agent.ip))
        # The policy rules only: the guard's binding of the agent's port is not host access
        # and is left as it is by the apply.
        now_lines = current.rule_lines() if current is not None else []
        want_lines = spec_rule_lines(_spec(agent, gateway, policy, resolved_new))
        removed, added = line_diff(now_lines, want_lines)
        evidence = {
            "ip": agent.ip,
            "state": agent.state,
            "table": table,
            "host_access_now": agent.host_access,
            "host_access_new": resolved_new,
            "rules_add": added,
            "rules_remove": removed,
        }
        if not added and not removed and same_host_access(agent.host_access, resolved_new):
            reason = "its rules already match"
            if now_lines != want_lines or agent.host_access != resolved_new:
                reason += " (the same entries in another order: the order of accept rules changes no verdict)"
            result.spared.append(Spared(akey, agent.agent_id, reason, evidence))
        else:
            result.targets.append(Target(akey, "re-write input rules", agent.agent_id, evidence))
