"""Release stale reservations: capacity held for agents that can no longer use it (ended with no
sandbox left, or a spawn past the stale window with no job running), through
``scalers.admission.ledger.release``. An active agent whose sandbox is gone is lost, not stale
(``lost-agents``). The rule: docs/operations.md ("stale-reservations").
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from agents.choices import TERMINAL_STATES, UNREGISTERED_STATES, AgentState
from scalers.admission.ledger import release
from scalers.backends.sandboxes import list_kici_containers
from scalers.lifecycle import stale_window_seconds
from scalers.models import Reservation, this_host

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, Spared, Target, age_seconds, is_registered


def _rq_job_status(job_id: str) -> str | None:
    if not job_id:
        return None
    try:
        import django_rq
        from rq.exceptions import NoSuchJobError
        from rq.job import Job

        connection = django_rq.get_connection("default")
        try:
            job = Job.fetch(job_id, connection=connection, serializer=settings.KICI_JOB_SERIALIZER)
            return job.get_status(refresh=True).value
        except NoSuchJobError:
            return "gone"
    except Exception:  # noqa: BLE001 - unknown is reported as such
        return "unknown"


def _sandbox_states(reservations) -> dict[str, str]:
    """agent id → container state for container-type agents whose sandbox can be listed; an agent
    missing from a successful listing maps to ``"gone"``; an unlistable runtime to ``"unknown"``;
    another host's scaler to ``"elsewhere"`` (its runtime is listed on that host only:
    docs/multi-host.md)."""
    states: dict[str, str] = {}
    by_scaler: dict[int, list] = {}
    for r in reservations:
        if r.agent.scaler.type in ("container", "bare-metal"):
            if r.agent.scaler.host != this_host():
                states[r.agent.agent_id] = "elsewhere"
                continue
            by_scaler.setdefault(r.scaler_id, []).append(r)
    for rows in by_scaler.values():
        listing = list_kici_containers(rows[0].agent.scaler)
        if listing is None:
            for r in rows:
                states[r.agent.agent_id] = "unknown"
            continue
        found = {}
        for summary in listing:
            agent_id = (summary.get("Labels") or {}).get("kici-agent-id")
            if agent_id:
                found[agent_id] = str(summary.get("State") or "").lower()
        for r in rows:
            states[r.agent.agent_id] = found.get(r.agent.agent_id, "gone")
    return states


class StaleReservations(Kind):
    name = OperationKind.STALE_RESERVATIONS
    volatile = frozenset({"age_seconds", "spawning_seconds"})
    swept = True

    def sweep_scopes(self) -> list[Scope]:
        return [Scope()]

    def plan(self, scope: Scope) -> Plan:
        now = timezone.now()
        window = stale_window_seconds()
        qs = Reservation.objects.select_related("agent", "agent__scaler", "scaler")
        if scope.scaler is not None:
            qs = qs.filter(scaler=scope.scaler)
        candidates = []
        for r in qs:
            agent = r.agent
            if agent.state in TERMINAL_STATES:
                candidates.append(r)
            elif agent.state in UNREGISTERED_STATES and agent.registered_at is None:
                started = agent.spawn_started_at or agent.created_at
                if started <= now - timedelta(seconds=window):
                    candidates.append(r)
        sandboxes = _sandbox_states(candidates)
        result = Plan()
        for r in candidates:
            agent = r.agent
            started = agent.spawn_started_at or agent.created_at
            evidence = {
                "agent_state": agent.state,
                "registered": is_registered(agent),
                "scaler": r.scaler.name,
                "owner_instance": r.owner_instance,
                "cpus": r.cpus,
                "memory_bytes": r.memory_bytes,
                "sandbox": sandboxes.get(agent.agent_id, "not probed"),
                "age_seconds": age_seconds(r.created_at, now),
            }
            key = f"reservation:{agent.agent_id}"
            if agent.state == AgentState.SPAWNING:
                job = _rq_job_status(agent.rq_job_id)
                evidence["spawning_seconds"] = age_seconds(started, now)
                evidence["spawn_job"] = job
                if job in ("started", "queued", "deferred", "scheduled"):
                    result.spared.append(Spared(key, agent.agent_id, f"its spawn job is still {job}", evidence))
                    continue
                reason = f"spawning for longer than {window}s and never registered"
            else:
                reason = f"agent {agent.state}"
            if evidence["sandbox"] in ("running", "paused", "restarting"):
                result.spared.append(
                    Spared(key, agent.agent_id, f"{reason}, but its container is still {evidence['sandbox']}", evidence)
                )
                continue
            if evidence["sandbox"] == "elsewhere":
                result.spared.append(
                    Spared(
                        key,
                        agent.agent_id,
                        f"{reason}, but its container is on host {r.scaler.host}, whose runtime only that host lists",
                        evidence,
                    )
                )
                continue
            if evidence["sandbox"] == "unknown":
                result.spared.append(
                    Spared(key, agent.agent_id, f"{reason}, but its runtime could not be listed", evidence)
                )
                continue
            evidence["why"] = reason
            result.targets.append(Target(key, "release reservation", agent.agent_id, evidence))
        return result

    def act(self, run, scope, plan, targets) -> None:
        for target in targets:
            try:
                release(target.subject, f"stale reservation released by operation #{run.operation_id}")
            except Exception as exc:  # noqa: BLE001
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            run.report(target.key, TargetOutcome.DONE, "released")
