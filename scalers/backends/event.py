"""The event backend: agents provisioned by someone else, asked for by signed events. The token is
never in the event: the provisioner redeems a claim code for it. Spawn, destroy, what a reload
changes and what is counted: docs/event-provisions.md ("The event backend").
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from agents.choices import EventType
from agents.events import record_connecting, record_event
from agents.models import Agent
from scalers.labels import declared_platform, label_set_gate
from scalers.metrics import SCALE_DOWN_EMITTED, SCALE_UP_EMITTED, count

from .base import SpawnControl, SpawnError, SpawnResult, scaler_option
from .claims import DEFAULT_AGENT_TOKEN_TTL_SECONDS, DEFAULT_CLAIM_TTL_SECONDS, create_claim, invalidate_claims
from .emitter import SCALE_DOWN, SCALE_UP, EventEmitError, HttpEventEmitter
from .orphans import OrphanTarget
from .spawn_env import console_url, full_labels, spawn_limits

log = logging.getLogger(__name__)


class EventBackend:
    """``type: event`` scalers. ``emitter``: anything with ``emit(event, payload, targets, deadline)``."""

    type = "event"
    spawns_on_local_host = False

    def __init__(self, scaler, *, emitter: Any = None, **_ignored: Any):
        self.scaler = scaler
        self.emitter = emitter or HttpEventEmitter()

    def reload(self, scaler) -> None:
        """Replace the entry: roles, token TTL and targets apply from the next spawn."""
        self.scaler = scaler

    def ensure_host_ready(self) -> None:
        return None

    @property
    def targets(self) -> list[str]:
        return [str(t) for t in scaler_option(self.scaler, "provisioningTargets", []) or []]

    def gate(self, agent) -> list[str]:
        """The gate of the agent's label set (``scalers.labels.label_set_gate``): the scaler's
        ``mandatoryLabels`` ∪ its platform's taints ∪ the plain taints declared in the set."""
        declared = agent.label_set.labels if agent.label_set_id else []
        return label_set_gate(declared, self.scaler.mandatory_labels or [], declared_platform(self.scaler.config))

    def scale_up_payload(self, agent, claim_code: str, request_id: str) -> dict:
        """``{scalerName, agentId, labels, mandatoryLabels, resources{cpus?, memBytes?},
        orchestratorUrl, claimCode, jobId?, requestId}``; never the token.

        ``mandatoryLabels`` is the label set's gate (:meth:`gate`); ``resources`` are the
        spawn's effective *limits* (cores, bytes; ``spawn_env.spawn_limits``), an undeclared
        (0) side left out, as the machine must be sized for what the agent may use."""
        limits = spawn_limits(agent)
        resources: dict = {}
        if limits.cpus > 0:
            resources["cpus"] = limits.cpus
        if limits.mem_bytes > 0:
            resources["memBytes"] = limits.mem_bytes
        payload = {
            "scalerName": self.scaler.name,
            "agentId": agent.agent_id,
            "labels": full_labels(agent),
            "mandatoryLabels": self.gate(agent),
            "resources": resources,
            "orchestratorUrl": console_url(self.scaler),
            "claimCode": claim_code,
            "requestId": request_id,
        }
        if agent.bound_job_id:
            payload["jobId"] = agent.bound_job_id
        return payload

    def spawn(self, agent, control: SpawnControl) -> SpawnResult:
        """Register a claim and emit scale-up; on an emit failure the claim is dropped and
        ``SpawnError`` raised (the job fails the agent and releases its reservation)."""
        agent.scaler = self.scaler  # the entry in force now, not the one the row was loaded with
        control.check("emit")
        claim_ttl = int(scaler_option(self.scaler, "claimTtlSeconds", DEFAULT_CLAIM_TTL_SECONDS))
        token_ttl = int(scaler_option(self.scaler, "agentTokenTtlSeconds", DEFAULT_AGENT_TOKEN_TTL_SECONDS))
        code = create_claim(agent, claim_ttl, token_ttl)
        request_id = str(uuid.uuid4())
        targets = self.targets
        record_event(agent, EventType.PROVISIONING, f"emitting {SCALE_UP} to {', '.join(targets) or 'no target'}")
        try:
            self.emitter.emit(SCALE_UP, self.scale_up_payload(agent, code, request_id), targets, control.deadline)
        except Exception as exc:
            invalidate_claims(agent.agent_id)
            raise SpawnError(f"scale-up emit failed: {exc}", "emit") from exc
        count(SCALE_UP_EMITTED, {"scaler": self.scaler.name})
        record_connecting(agent, "waiting for the provisioned agent to register")
        return SpawnResult(managed_id=agent.agent_id, context={"requestId": request_id, "targets": targets})

    def destroy(self, agent, reason: str = "shutdown") -> None:
        """Emit scale-down once per agent (a second destroy emits nothing), to the targets
        recorded at spawn, else the configured ones; then invalidate claims (failure only logged).
        An agent whose scale-up was never delivered gets no scale-down. A failed delivery raises
        ``EventEmitError`` (the caller keeps the reservation and retries)."""
        if not (agent.backend_context or {}).get("requestId"):
            # No scale-up was ever delivered for this agent: there is nothing to scale down.
            self._invalidate(agent)
            return
        updated = (
            Agent.objects.filter(pk=agent.pk)
            .exclude(backend_context__has_key="scaleDownSent")
            .update(backend_context={**(agent.backend_context or {}), "scaleDownSent": reason})
        )
        if updated:
            targets = (agent.backend_context or {}).get("targets") or self.targets
            payload = {
                "scalerName": self.scaler.name,
                "agentId": agent.agent_id,
                "reason": reason or "shutdown",
                "requestId": str(uuid.uuid4()),
            }
            try:
                self.emitter.emit(SCALE_DOWN, payload, targets)
            except EventEmitError:
                Agent.objects.filter(pk=agent.pk).update(backend_context=agent.backend_context or {})
                raise
            count(SCALE_DOWN_EMITTED, {"scaler": self.scaler.name, "reason": payload["reason"]})
        self._invalidate(agent)

    @staticmethod
    def _invalidate(agent) -> None:
        try:
            invalidate_claims(agent.agent_id)
        except Exception:  # a claim left behind expires on its own
            log.warning("could not invalidate the claims of %s", agent.agent_id, exc_info=True)

    def shutdown_all(self) -> None:
        """Emits nothing: the provisioned machines outlive the console process."""
        return None

    def reap_unowned(self, agent_id: str) -> bool:
        return False

    def plan_orphans(self) -> list[OrphanTarget]:
        return []

    def apply_orphans(self, plan: list[OrphanTarget]) -> int:
        return 0

    def cleanup_orphans(self) -> int:
        return 0
