"""Is an agent's sandbox still there? One probe per scaler for many agents (for lost-agent detection,
``agents.liveness``; ``operations.kinds.lost_agents``); read-only, nothing is stopped, removed or
signalled here. What each backend's probe answers: docs/lost-agents.md."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from scalers.models import this_host

from .baremetal import BareMetalBackend, _alive
from .firecracker.pidprobe import probe_vm_pid
from .runtime import docker_client_for, runtime_for_scaler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxProbe:
    """What one probe saw: ``state`` (see the module doc), ``detail`` for people (docker's status
    line, the pid probe's reason), ``what`` the sandbox's name (``container``, ``VM``, ``process``)."""

    state: str
    detail: str = ""
    what: str = "sandbox"


def list_kici_containers(scaler) -> list[dict] | None:
    """Every kici-managed container summary on ``scaler``'s runtime, or None when it cannot be listed."""
    try:
        client = docker_client_for(runtime_for_scaler(scaler), timeout=30)
    except Exception as exc:  # noqa: BLE001 - unreachable runtime: nothing is proven
        log.warning("cannot reach the container runtime of %s: %s", scaler, exc)
        return None
    try:
        return client.api.containers(all=True, filters={"label": ["kici-managed=true"]})
    except Exception as exc:  # noqa: BLE001
        log.warning("cannot list the containers of %s: %s", scaler, exc)
        return None
    finally:
        client.close()


def _container_probes(scaler, agents) -> dict[str, SandboxProbe]:
    listing = list_kici_containers(scaler)
    if listing is None:
        return {
            a.agent_id: SandboxProbe("unknown", "the container runtime could not be listed", "container")
            for a in agents
        }
    by_agent: dict[str, dict] = {}
    by_id: dict[str, dict] = {}
    for summary in listing:
        by_id[summary.get("Id", "")] = summary
        agent_id = (summary.get("Labels") or {}).get("kici-agent-id")
        if agent_id:
            by_agent.setdefault(agent_id, summary)
    out = {}
    for agent in agents:
        found = (by_id.get(agent.managed_id) if agent.managed_id else None) or by_agent.get(agent.agent_id)
        if found is None:
            out[agent.agent_id] = SandboxProbe("missing", "no such container on the runtime", "container")
        else:
            out[agent.agent_id] = SandboxProbe(
                str(found.get("State") or "unknown").lower(), str(found.get("Status") or ""), "container"
            )
    return out


def _vm_probe(agent) -> SandboxProbe:
    chroot = (agent.backend_context or {}).get("chroot")
    if not chroot:
        return SandboxProbe("unknown", "no chroot recorded for this VM", "VM")
    probe = probe_vm_pid(chroot)
    if probe.running:
        return SandboxProbe("running", f"firecracker pid {probe.pid} ({probe.reason})", "VM")
    if probe.reason in ("no-process", "recycled"):
        return SandboxProbe("exited", f"firecracker pid {probe.pid} is not running ({probe.reason})", "VM")
    if not Path(chroot).exists():
        return SandboxProbe("missing", f"chroot {chroot} no longer exists", "VM")
    return SandboxProbe("unknown", f"pid probe: {probe.reason}", "VM")


def _process_probe(agent) -> SandboxProbe:
    context = agent.backend_context or {}
    pid = context.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return SandboxProbe("unknown", "no pid recorded for this process", "process")
    if _alive(pid, context.get("start_time")):  # the same pid + start-time check the backend's destroy uses
        return SandboxProbe("running", f"pid {pid}", "process")
    return SandboxProbe("exited", f"pid {pid} is gone", "process")


def probe_sandboxes(scaler, agents) -> dict[str, SandboxProbe]:
    """``agent_id`` → :class:`SandboxProbe` for ``agents`` (rows of ``scaler``; see the module doc).

    At most one runtime listing per call. Never raises for an unreachable runtime (``unknown``).
    Another host's scaler is ``not probed``: its sandboxes are on a runtime only that host reaches,
    and a look at this host's would call them gone.
    """
    agents = list(agents)
    if not agents:
        return {}
    if scaler.host != this_host():
        return {
            a.agent_id: SandboxProbe(
                "not probed", f"it runs on host {scaler.host}, probed by that host's console", "sandbox"
            )
            for a in agents
        }
    if scaler.type == "event":
        return {
            a.agent_id: SandboxProbe(
                "not probed", "an event agent runs on a machine this console does not manage", "machine"
            )
            for a in agents
        }
    if scaler.type == "firecracker":
        return {a.agent_id: _vm_probe(a) for a in agents}
    in_containers = agents
    out: dict[str, SandboxProbe] = {}
    if scaler.type == "bare-metal":
        in_containers = []
        for agent in agents:
            if BareMetalBackend.mode_for(agent) == "process":
                out[agent.agent_id] = _process_probe(agent)
            else:
                in_containers.append(agent)
    if in_containers:
        out.update(_container_probes(scaler, in_containers))
    return out
