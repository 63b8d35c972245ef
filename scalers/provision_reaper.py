"""The event-provision reaper: ends event-scaler provisions whose agent never registered, or
registered and went silent, through the ordinary teardown (which emits ``kici.scaler.scale-down``).
Run by the leading sweeper; the verdict per provision is ``scalers.backends.event_reaper``'s. How
the reference's cluster notions read in a console that shares one database, and why it acts
without an approved operation: docs/event-provisions.md ("The reaper").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.models import Agent, ScalerEvent
from scalers.backends.event_reaper import flap_grace_ms, may_reap, reap_verdict
from scalers.choices import ScalerType
from scalers.leader import connected_instances
from scalers.lifecycle import fail_connecting, fail_spawn, teardown_agent
from scalers.metrics import EXTERNAL_PROVISION_TIMEOUT, REAP_BLOCKED, REAP_UNSEEN_PROVISIONS, count, set_gauge

log = logging.getLogger("scalers.provision_reaper")

#: States in which a provision is still in flight (``destroying`` is already being given back).
CANDIDATE_STATES = (AgentState.SPAWNING, AgentState.CONNECTING, AgentState.RUNNING, AgentState.DRAINING)


@dataclass(frozen=True)
class Windows:
    """The reaper's windows for one sweep, in ms (re-read from settings every sweep)."""

    interval_ms: int
    spawn_timeout_ms: int
    flap_grace_ms: int
    stranded_timeout_ms: int
    reattempt_ms: int
    heartbeat_timeout_ms: int


def current_windows() -> Windows:
    return Windows(
        interval_ms=int(settings.KICI_SCALER_REAP_INTERVAL_MS),
        spawn_timeout_ms=int(settings.KICI_SPAWN_TIMEOUT_SECONDS) * 1000,
        flap_grace_ms=flap_grace_ms(settings.KICI_REROUTE_FLAP_GRACE_MS, settings.KICI_PEER_STALE_TIMEOUT_MS),
        stranded_timeout_ms=int(settings.KICI_SCALER_REAP_STRANDED_TIMEOUT_MS),
        reattempt_ms=int(settings.KICI_SCALER_REAP_REATTEMPT_MS),
        heartbeat_timeout_ms=int(settings.KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS) * 1000,
    )


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did: ``blocked`` (stood down), ``condemned`` agent ids with their verdict,
    ``unseen`` (provisions unseen for at least the flap grace)."""

    blocked: bool
    condemned: dict[str, str]
    unseen: int


class ProvisionReaper:
    """One leader's reaper. ``instance_id``: this console's (``settings.KICI_INSTANCE_ID``)."""

    def __init__(self, instance_id: str):
        self.instance_id = instance_id
        self.next_due_ms = 0
        self.reset()

    def reset(self) -> None:
        """Forget every clock (on losing leadership): the next leader starts them again."""
        self.unseen_since: dict[str, int] = {}
        self.last_attempt: dict[str, int] = {}
        self.peers_seen: dict[str, int] = {}
        self.unknown_owner_logged: set[str] = set()
        self.blocked = False
        self.next_due_ms = 0

    def tick(self, now: datetime | None = None) -> SweepResult | None:
        """Sweep when the interval has passed since the last sweep, else None."""
        now = now or timezone.now()
        windows = current_windows()
        if _ms(now) < self.next_due_ms:
            return None
        self.next_due_ms = _ms(now) + windows.interval_ms
        return self.sweep(now, windows)

    # One sweep ---------------------------------------------------------------------------------

    def sweep(self, now: datetime | None = None, windows: Windows | None = None) -> SweepResult:
        """Stand down or judge every candidate; condemned ones are torn down. Publishes the gauges."""
        now = now or timezone.now()
        windows = windows or current_windows()
        now_ms = _ms(now)
        with connection.cursor() as cur:
            connected = connected_instances(cur) - {self.instance_id}
        for peer in connected:
            self.peers_seen[peer] = now_ms
        if not may_reap(len(self.peers_seen), len(connected)):
            if not self.blocked:
                log.warning(
                    "skipping the event-provision reap: none of the %d console(s) this one knows is connected",
                    len(self.peers_seen),
                )
            self.blocked = True
            self.unseen_since.clear()
            self._publish(blocked=True, unseen=0)
            return SweepResult(True, {}, 0)
        self.blocked = False
        condemned: dict[str, str] = {}
        try:
            candidates = self._candidates(now, windows)
            self._prune({a.agent_id for a in candidates})
            adopters = self._adopters([a.pk for a in candidates if a.registered_at is not None])
            for agent in candidates:
                verdict = self._judge(agent, adopters.get(agent.pk), connected, now_ms, windows)
                if verdict is None:
                    continue
                last = self.last_attempt.get(agent.agent_id)
                if last is not None and now_ms - last < windows.reattempt_ms:
                    continue
                self.last_attempt[agent.agent_id] = now_ms
                if self._condemn(agent, verdict, now_ms):
                    condemned[agent.agent_id] = verdict
        finally:
            unseen = sum(1 for since in self.unseen_since.values() if now_ms - since >= windows.flap_grace_ms)
            self._publish(blocked=False, unseen=unseen)
        return SweepResult(False, condemned, unseen)

    def _candidates(self, now: datetime, windows: Windows) -> list[Agent]:
        cutoff = now - timedelta(milliseconds=windows.spawn_timeout_ms)
        return list(
            Agent.objects.select_related("scaler", "label_set")
            .filter(
                scaler__type=ScalerType.EVENT,
                state__in=CANDIDATE_STATES,
                backend_context__has_key="requestId",
                created_at__lt=cutoff,
            )
            .exclude(backend_context__has_key="scaleDownSent")
            .order_by("created_at")
        )

    @staticmethod
    def _adopters(agent_pks: list[int]) -> dict[int, str]:
        """``{agent pk: instance that took its registration}`` from the ``agent.registered`` events."""
        if not agent_pks:
            return {}
        rows = ScalerEvent.objects.filter(agent_id__in=agent_pks, type=EventType.REGISTERED).values_list(
            "agent_id", "payload"
        )
        return {pk: str((payload or {}).get("instance") or "") for pk, payload in rows}

    def _prune(self, live: set[str]) -> None:
        for table in (self.unseen_since, self.last_attempt):
            for agent_id in [k for k in table if k not in live]:
                del table[agent_id]
        self.unknown_owner_logged &= live

    def _adopter_alive(self, adopter: str, connected: set[str], now_ms: int, grace_ms: int) -> bool:
        if adopter == self.instance_id or adopter in connected:
            return True
        seen = self.peers_seen.get(adopter)
        return seen is not None and now_ms - seen <= grace_ms

    def _judge(self, agent: Agent, adopter: str | None, connected: set[str], now_ms: int, w: Windows) -> str | None:
        """The verdict's action when it condemns, else None (clock started, reset or kept)."""
        seen = (
            agent.state in (AgentState.RUNNING, AgentState.DRAINING)
            and agent.last_heartbeat is not None
            and now_ms - _ms(agent.last_heartbeat) < w.heartbeat_timeout_ms
        )
        adopted_by = None
        if agent.registered_at is not None:
            adopted_by = adopter or agent.owner_instance or "unknown"
        verdict = reap_verdict(
            now_ms=now_ms,
            registered=seen,
            unseen_since_ms=self.unseen_since.get(agent.agent_id),
            grace_ms=w.flap_grace_ms,
            owner=agent.owner_instance or None,
            adopted_by=adopted_by,
            adopter_alive=adopted_by is not None
            and self._adopter_alive(adopted_by, connected, now_ms, w.flap_grace_ms),
            spawned_at_ms=_ms(agent.spawn_started_at or agent.created_at),
            spawn_timeout_ms=w.spawn_timeout_ms,
            stranded_timeout_ms=w.stranded_timeout_ms,
        )
        if verdict.clock == "reset":
            if self.unseen_since.pop(agent.agent_id, None) is not None:
                log.info("event provision %s seen again: its unseen clock is cleared", agent.agent_id)
        elif verdict.clock == "start":
            self.unseen_since[agent.agent_id] = now_ms
            log.info("event provision %s is registered nowhere: unseen clock started", agent.agent_id)
        if verdict.reason == "no owner recorded" and agent.agent_id not in self.unknown_owner_logged:
            self.unknown_owner_logged.add(agent.agent_id)
            log.warning("sparing event provision %s: no owner console is recorded for it", agent.agent_id)
        return None if verdict.action == "spare" else verdict.action

    def _condemn(self, agent: Agent, verdict: str, now_ms: int) -> bool:
        """Tear ``agent`` down with scale-down reason ``verdict``. A failed delivery leaves it
        ``destroying`` with its reservation (``retry_stuck_teardowns`` retries).

        ``spawn-timeout`` of a ``connecting`` agent goes through ``fail_connecting``: a
        compare-and-swap to ``destroying`` (an agent that registered since the candidates were
        read is left alone: False) and its tokens revoked, so a late registration cannot revive
        it. Returns True when the agent was condemned."""
        unseen_s = (now_ms - self.unseen_since.get(agent.agent_id, now_ms)) // 1000
        log.warning("reaping event provision %s (%s, unseen %d s)", agent.agent_id, verdict, unseen_s)
        payload = {"verdict": verdict, "unseenSeconds": unseen_s}
        if verdict == "spawn-timeout":
            detail = f"the provisioned agent never registered (reaper: spawn-timeout, unseen {unseen_s} s)"
            if agent.state == AgentState.CONNECTING:
                if not fail_connecting(agent, detail, reason="spawn-timeout", destroy_reason="spawn-timeout"):
                    return False
            else:
                fail_spawn(agent, detail, reason="spawn-timeout", destroy_reason="spawn-timeout")
            if "scaleDownSent" in (Agent.objects.get(pk=agent.pk).backend_context or {}):
                count(EXTERNAL_PROVISION_TIMEOUT, {"scaler": agent.scaler.name})
            return True
        record_event(agent, EventType.LOST, f"silent for {unseen_s} s: reaped (heartbeat-timeout)", payload=payload)
        teardown_agent(
            agent,
            "reaped: heartbeat-timeout",
            final_state=AgentState.FAILED,
            failure_reason=f"lost: no heartbeat for {unseen_s} s (event-provision reaper)",
            destroy_reason="heartbeat-timeout",
        )
        return True

    def _publish(self, *, blocked: bool, unseen: int) -> None:
        set_gauge(REAP_BLOCKED, 1 if blocked else 0)
        set_gauge(REAP_UNSEEN_PROVISIONS, unseen)

    def stand_down(self) -> None:
        """Leadership lost: forget the clocks and publish a reaper that is not blocked, with nothing unseen."""
        self.reset()
        self._publish(blocked=False, unseen=0)
