"""Plugs helper "fc"'s ``firecracker.backend.FirecrackerBackend`` into the backend protocol of ``base``.

The Firecracker backend is keyed by agent id and takes the label-set entry, limits and URL as
arguments; this adapter supplies them from the ``Agent`` row, mints the registration token,
records its events on the agent, and maps destroy to ``destroy`` then ``reap_unowned`` (a VM
spawned by another worker process is not in this instance's memory). The deadline is handed down
as ``timeout_s``; a cancellation is checked before the boot starts (the VM boot then runs to its
own deadline).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .base import SpawnControl, SpawnError, SpawnResult
from .spawn_env import console_url, full_labels, network_policy, spawn_limits


def build_firecracker_backend(scaler, **options: Any):
    """A ``FirecrackerBackend`` for a firecracker ``Scaler`` row (settings from its entry and the
    top-level ``firecracker`` block, the database IP allocator, the configured nft table)."""
    from network.ipalloc_db import DbIpAllocator
    from network.nft.apply import NftClient
    from scalers.backends.firecracker.backend import FirecrackerBackend
    from scalers.backends.firecracker.settings import FirecrackerSettings
    from scalers.models import ConfigState

    from .isolation import host_services

    entry = {**(scaler.config or {}), "name": scaler.name, "maxAgents": scaler.max_agents}
    fc = FirecrackerSettings.from_config(entry, ConfigState.load().firecracker or {})
    nft = options.pop("nft", None) or NftClient(fc.table)
    return FirecrackerBackend(fc, DbIpAllocator(fc.cidr, fc.gateway), nft, host_services=host_services(), **options)


class FirecrackerAdapter:
    """``type: firecracker`` scalers through the common protocol."""

    type = "firecracker"
    spawns_on_local_host = True

    def __init__(self, scaler, *, backend: Any = None, **options: Any):
        self.scaler = scaler
        self.fc = backend or build_firecracker_backend(scaler, **options)

    def reload(self, scaler) -> None:
        self.scaler = scaler

    def ensure_host_ready(self):
        return self.fc.ensure_host_ready()

    def spawn(self, agent, control: SpawnControl) -> SpawnResult:
        from agents.events import record_event
        from agents.tokens import mint_registration_token

        control.check("spawn")
        self.fc.mint_token = lambda agent_id, labels: mint_registration_token(agent)
        self.fc._emit_cb = lambda agent_id, type, detail, payload=None: record_event(agent, type, detail, payload)
        limits = spawn_limits(agent)
        fc_limits = SimpleNamespace(cpus=limits.cpus or None, memory_bytes=limits.mem_bytes or None) if limits.is_set else None
        remaining = control.remaining()
        entry = dict(agent.label_set.config if agent.label_set_id else {})
        entry["networkPolicy"] = network_policy(agent.label_set)
        try:
            vm = self.fc.spawn(
                agent.agent_id, entry, fc_limits, console_url(agent.scaler),
                labels=full_labels(agent), timeout_s=max(1.0, remaining) if remaining is not None else None,
            )
        except Exception as exc:
            err = SpawnError(str(exc), "spawn")
            err.event_recorded = True  # the Firecracker backend emitted its own scaler.failed
            raise err from exc
        return SpawnResult(managed_id=agent.agent_id, ip=vm.ip, host_access=list(vm.host_access or []), context={"tap": vm.tap})

    def destroy(self, agent, reason: str = "shutdown") -> None:
        if not self.fc.destroy(agent.agent_id):
            self.fc.reap_unowned(agent.agent_id)

    def reap_unowned(self, agent_id: str) -> bool:
        return self.fc.reap_unowned(agent_id)

    def plan_orphans(self):
        return self.fc.plan_orphans()

    def apply_orphans(self, plan) -> int:
        """Sandboxes cleaned plus rule sets deleted (the Firecracker ``OrphanReport`` summed)."""
        report = self.fc.apply_orphans(plan)
        return int(report.cleaned) + int(report.rules_deleted)

    def cleanup_orphans(self) -> int:
        return self.fc.cleanup_orphans()
