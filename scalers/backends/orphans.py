"""Orphan planning for agent containers: pure functions over one container listing (SPEC (e)
``cleanupOrphans``; seed container-backend.d.ts).

The sweep once removed every ``kici-managed=true`` container on the host; two consoles sharing
a docker host then killed each other's running agents at every boot and reload. A container is
planned for removal only when ALL of these hold:

- it carries ``kici-managed=true`` and exactly this scaler's ``kici-scaler-name`` (an empty,
  missing or prefix-alike name, ``ci`` vs ``ci-2``, is someone else's);
- its ``kici-agent-id`` is not tracked by this console (an agent row of this scaler in
  spawning / running / draining / destroying);
- it is not running, or it is running and its agent id is NOT registered. A running container
  without an agent id, or any running container when the registry is unwired, is spared.

Rules: an address on ``kici-agent-net`` with rules in this console's table that nothing holds
(``scalers.backends.holders``: no kici-managed container of ANY scaler or console, no active agent
row, no VM allocation). When the runtime listing failed, no rule is planned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .docker_net import ISOLATED_NETWORK_NAME

#: Container states that mean "a process may be running in there" (docker's State strings).
ALIVE_STATES = frozenset({"running", "paused", "restarting"})
#: A container already being removed is left to the runtime.
SKIP_STATES = frozenset({"removing"})


class OrphanSweepRefused(ValueError):
    """The sweep would be unsafe to run: e.g. the scaler name is blank."""


@dataclass(frozen=True)
class OrphanTarget:
    """One thing the sweep would remove, with the evidence for it.

    ``kind``: ``"container"`` (``target`` = container id) or ``"rule"`` (``target`` = address).
    ``scaler``: the sweeping scaler. ``agent_id``: the container's ``kici-agent-id`` ("" if none).
    ``reason``: one line for a person. ``evidence``: the facts the decision used (container
    name, state, labels, address, tracked/registered answers). JSON-serialisable via
    :meth:`to_dict` / :meth:`from_dict`, so a plan can be stored, shown and approved.
    """

    kind: str
    target: str
    scaler: str
    agent_id: str = ""
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OrphanTarget:
        return cls(
            kind=str(data["kind"]),
            target=str(data["target"]),
            scaler=str(data.get("scaler", "")),
            agent_id=str(data.get("agent_id", "")),
            reason=str(data.get("reason", "")),
            evidence=dict(data.get("evidence") or {}),
        )


def container_addresses(summary: dict) -> list[str]:
    """Addresses a container summary holds or has reserved on ``kici-agent-net`` (dynamic and static)."""
    nets = (summary.get("NetworkSettings") or {}).get("Networks") or {}
    ep = nets.get(ISOLATED_NETWORK_NAME) or {}
    out = []
    if ep.get("IPAddress"):
        out.append(ep["IPAddress"])
    static = (ep.get("IPAMConfig") or {}).get("IPv4Address")
    if static and static not in out:
        out.append(static)
    return out


def plan_container_orphans(
    summaries: Iterable[dict],
    scaler_name: str,
    tracked: set[str],
    is_registered: Callable[[str], bool] | None,
) -> list[OrphanTarget]:
    """Containers of ``scaler_name`` to remove, per the module rules; pure.

    ``summaries``: the runtime's container list (``GET /containers/json?all=1`` objects: ``Id``,
    ``Names``, ``State``, ``Labels``, ``NetworkSettings``). ``tracked``: agent ids this console
    tracks. ``is_registered``: the registry probe, or ``None`` (unwired ⇒ assume registered).
    Raises :class:`OrphanSweepRefused` for a blank ``scaler_name``.
    """
    if not isinstance(scaler_name, str) or not scaler_name.strip():
        raise OrphanSweepRefused(f"refusing to sweep orphans: the scaler name is blank ({scaler_name!r})")
    targets = []
    for s in summaries:
        labels = s.get("Labels") or {}
        if labels.get("kici-managed") != "true" or labels.get("kici-scaler-name") != scaler_name:
            continue
        agent_id = labels.get("kici-agent-id") or ""
        state = str(s.get("State") or "").lower()
        if state in SKIP_STATES or (agent_id and agent_id in tracked):
            continue
        evidence = {
            "name": ((s.get("Names") or [""])[0] or "").lstrip("/"),
            "state": state,
            "status": s.get("Status", ""),
            "addresses": container_addresses(s),
            "labels": {k: v for k, v in labels.items() if k.startswith("kici-")},
            "tracked": False,
        }
        if state in ALIVE_STATES:
            if not agent_id or is_registered is None:
                continue
            if is_registered(agent_id):
                continue
            evidence["registered"] = False
            reason = f"{state} but agent {agent_id} is not registered"
        else:
            reason = f"{state or 'unknown state'}, not tracked"
        targets.append(OrphanTarget("container", s["Id"], scaler_name, agent_id, reason, evidence))
    return targets


def plan_rule_orphans(
    addresses_with_rules: Iterable[str] | None, live: set[str] | None, scaler_name: str, table: str
) -> list[OrphanTarget]:
    """Rule sets to delete: addresses with rules that nothing in ``live`` holds; pure.

    ``addresses_with_rules`` None (unreadable table) or ``live`` None (runtime listing failed)
    plans nothing: reaping blind is worse than leaving a stale rule (seed container-backend.d.ts).
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
