"""The orphan rule for agent containers, written once: pure functions over containers as listed.
Consoles may share a docker host, so a container is an orphan of a scaler only when every
condition of docs/sandbox-ownership.md ("Orphan containers") holds; :func:`judge_container` decides
for one container, :func:`plan_container_orphans` for a listing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..docker_net import container_addresses
from ..orphans import OrphanTarget
from ..ownership import MINE, SCALER_LABEL, UNKNOWN_REASON, Owner, judge_ownership

log = logging.getLogger(__name__)

#: Container states that mean "a process may be running in there" (docker's State strings).
ALIVE_STATES = frozenset({"running", "paused", "restarting"})
#: A container already being removed is left to the runtime.
SKIP_STATES = frozenset({"removing"})


class OrphanSweepRefused(ValueError):
    """The sweep would be unsafe to run: e.g. the scaler name is blank."""


@dataclass(frozen=True)
class TrackedAgent:
    """What the database says about an agent id this console tracks for the scaler.

    Only the spared reason uses ``state`` (its row's state, "" when the caller knows only that it is
    tracked) and ``registered`` (``registered_at`` set).
    """

    state: str = ""
    registered: bool = False


@dataclass(frozen=True)
class SparedContainer:
    """A container of the sweeping scaler that is not an orphan, and why (``reason``)."""

    container_id: str
    name: str
    agent_id: str
    state: str
    reason: str


@dataclass
class ContainerPlan:
    """The verdicts on one listing: ``targets`` to remove, the scaler's other containers ``spared``,
    ``rules``: rule sets to delete (filled by the backend when isolation is on), and ``summaries``:
    the listing's entries of the scaler's containers, by id."""

    targets: list[OrphanTarget] = field(default_factory=list)
    spared: list[SparedContainer] = field(default_factory=list)
    rules: list[OrphanTarget] = field(default_factory=list)
    summaries: dict[str, dict] = field(default_factory=dict)


def summary_of_inspect(info: dict) -> dict:
    """An inspect result (``GET /containers/<id>/json``) in the shape of a list summary."""
    state = info.get("State") or {}
    status = str(state.get("Status") or "").lower()
    if not status:
        status = next((flag.lower() for flag in ("Restarting", "Paused", "Running") if state.get(flag)), "")
    return {
        "Id": info.get("Id", ""),
        "Names": [info.get("Name") or ""],
        "State": status,
        "Status": "",
        "Labels": (info.get("Config") or {}).get("Labels") or {},
        "NetworkSettings": info.get("NetworkSettings") or {},
    }


def _tracked_reason(agent_id: str, agent: TrackedAgent, state: str) -> str:
    if not agent.state:
        return f"tracked: agent {agent_id} is tracked by this console"
    registered = " and registered" if agent.registered else ""
    if state not in ALIVE_STATES and agent.state in ("running", "draining"):
        # its agent is lost: released (with this container) by a lost-agents operation
        return (
            f"tracked: agent {agent_id} is {agent.state}{registered}, "
            f"but its container is {state or 'gone'}: see lost-agents"
        )
    return f"tracked: agent {agent_id} is {agent.state}{registered}"


def judge_container(
    summary: dict,
    owner: Owner,
    tracked: Mapping[str, TrackedAgent],
    is_registered: Callable[[str], bool] | None,
) -> OrphanTarget | SparedContainer | None:
    """The verdict on one container for the sweep of ``owner`` (this console's claim on one
    scaler), per the module rules; pure.

    ``summary``: a container as listed (``GET /containers/json?all=1``: ``Id``, ``Names``, ``State``,
    ``Status``, ``Labels``, ``NetworkSettings``). ``tracked``: agent ids this console tracks.
    ``is_registered``: the registry probe, or ``None`` (unwired: assume registered). Returns an
    :class:`OrphanTarget` (remove it, with the evidence), a :class:`SparedContainer` (named with this
    scaler, kept, with the reason), or ``None`` (not this scaler's container).
    """
    labels = summary.get("Labels") or {}
    scaler_name = owner.scaler_name
    if labels.get("kici-managed") != "true" or labels.get(SCALER_LABEL) != scaler_name:
        return None
    agent_id = labels.get("kici-agent-id") or ""
    state = str(summary.get("State") or "").lower()
    name = ((summary.get("Names") or [""])[0] or "").lstrip("/")
    alive = state in ALIVE_STATES

    def spared(reason: str) -> SparedContainer:
        return SparedContainer(summary["Id"], name, agent_id, state, reason)

    ownership = judge_ownership(labels, owner)
    if ownership.ownership != MINE:
        return spared(ownership.reason)
    if state in SKIP_STATES:
        return spared(f"being removed by the runtime ({state})")
    if agent_id and agent_id in tracked:
        return spared(_tracked_reason(agent_id, tracked[agent_id], state))
    if alive:
        if not agent_id:
            return spared(f"{state} with no kici-agent-id label: cannot tell whose it is")
        if is_registered is None:
            return spared(f"{state}: no agent registry is wired, so agent {agent_id} is assumed registered")
        if is_registered(agent_id):
            return spared(f"{state} and agent {agent_id} is registered")
    evidence = {
        "name": name,
        "state": state,
        "status": summary.get("Status", ""),
        "addresses": container_addresses(summary),
        "labels": {k: v for k, v in labels.items() if k.startswith("kici-")},
        "tracked": False,
    }
    if alive:
        evidence["registered"] = False
        reason = f"{state} but agent {agent_id} is not registered"
    else:
        reason = f"{state or 'unknown state'}, not tracked"
    return OrphanTarget("container", summary["Id"], scaler_name, agent_id, reason, evidence)


def plan_container_orphans(
    summaries: Iterable[dict],
    owner: Owner,
    tracked: Mapping[str, TrackedAgent],
    is_registered: Callable[[str], bool] | None,
) -> ContainerPlan:
    """:func:`judge_container` over a listing: the targets and the spared, in listing order.

    Changes nothing; a container of unknown ownership is logged (warning). Raises
    :class:`OrphanSweepRefused` for a blank scaler name.
    """
    scaler_name = owner.scaler_name
    if not isinstance(scaler_name, str) or not scaler_name.strip():
        raise OrphanSweepRefused(f"refusing to sweep orphans: the scaler name is blank ({scaler_name!r})")
    plan = ContainerPlan()
    for s in summaries:
        verdict = judge_container(s, owner, tracked, is_registered)
        if verdict is not None:
            plan.summaries[s["Id"]] = s
        if isinstance(verdict, OrphanTarget):
            plan.targets.append(verdict)
        elif verdict is not None:
            plan.spared.append(verdict)
            if verdict.reason.startswith(UNKNOWN_REASON):
                log.warning("container %s of scaler %s is never reaped: %s", s["Id"][:12], scaler_name, verdict.reason)
    return plan


def plan_rule_orphans(
    addresses_with_rules: Iterable[str] | None, live: set[str] | None, scaler_name: str, table: str
) -> list[OrphanTarget]:
    """Rule sets to delete: addresses with rules that nothing in ``live`` holds; pure.

    ``addresses_with_rules`` None (unreadable table) or ``live`` None (runtime listing failed)
    plans nothing: reaping blind is worse than leaving a stale rule.
    """
    if addresses_with_rules is None or live is None:
        return []
    return [
        OrphanTarget(
            "rule",
            addr,
            scaler_name,
            "",
            f"rules in table {table} for {addr}, which no container holds",
            {"table": table, "address": addr},
        )
        for addr in addresses_with_rules
        if addr not in live
    ]
