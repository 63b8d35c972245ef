"""Release lost agents: agents still ``running``/``draining`` whose sandbox is gone or that stopped
heartbeating (``agents.liveness`` has the rule): otherwise an agent whose container dies stays
running forever. The evidence, the re-plan, and why only a gone sandbox is released without a
person: docs/lost-agents.md ("The lost-agents kind")."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.liveness import WATCHED_STATES, assess, heartbeat_key, heartbeat_timeout_seconds
from agents.models import Agent
from scalers.backends.sandboxes import probe_sandboxes
from scalers.holds import hold_wording
from scalers.lifecycle import teardown_agent
from scalers.models import RecoveryReport, Reservation, Scaler

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, ScopeInvalid, Spared, Target, age_seconds, is_registered

EVIDENCE = ("sandbox-gone", "heartbeat")
_CLASS = {"sandbox": "sandbox-gone", "heartbeat": "heartbeat"}
ACTION = "remove remains, fail agent, release reservation"


def console_boot_time() -> datetime | None:
    """When a console last booted (its latest boot recovery): heartbeats sent while it was
    down were never heard, so silence is counted from then at the earliest."""
    return (
        RecoveryReport.objects.filter(trigger="boot")
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )


def teardown_lost_agent(
    agent_pk: int, state: str, last_heartbeat, *, reason: str, failure_reason: str, hold: bool = False
) -> tuple[str, str]:
    """Release one lost agent → ``(TargetOutcome, detail)``: a compare-and-swap from ``state`` with
    exactly ``last_heartbeat`` (as planned) to ``destroying`` (``skipped`` when the row moved), then
    ``scalers.lifecycle.teardown_agent`` (``failed`` with ``failure_reason``, destroy reason
    ``heartbeat-timeout``). A destroy that raises leaves it ``destroying`` with its reservation
    (``failed``; the sweeper retries). With ``hold`` a debug hold keeps the sandbox instead
    (``done``, saying so). Design: docs/lost-agents.md.
    """
    now = timezone.now()
    moved = Agent.objects.filter(pk=agent_pk, state=state, last_heartbeat=last_heartbeat).update(
        state=AgentState.DESTROYING, updated_at=now
    )
    if not moved:
        row = Agent.objects.filter(pk=agent_pk).values("state", "last_heartbeat").first()
        if row is None:
            return TargetOutcome.SKIPPED, "the agent row is gone"
        if row["last_heartbeat"] != last_heartbeat:
            return (
                TargetOutcome.SKIPPED,
                f"it heartbeated since the re-check (last heartbeat {row['last_heartbeat']}): not lost",
            )
        return TargetOutcome.SKIPPED, f"it is {row['state']} now, no longer {state}"
    agent = Agent.objects.select_related("scaler").get(pk=agent_pk)
    released = teardown_agent(
        agent,
        reason,
        final_state=AgentState.FAILED,
        failure_reason=failure_reason,
        destroy_reason="heartbeat-timeout",
        hold=hold,
    )
    agent.refresh_from_db()
    if agent.state == AgentState.HELD:
        return TargetOutcome.DONE, f"held for debugging, its sandbox and reservation kept: {hold_wording(agent)}"
    if agent.state != AgentState.FAILED:
        return (
            TargetOutcome.FAILED,
            f"the backend could not remove its remains; the agent stays {agent.state} with its reservation and "
            "the sweeper retries",
        )
    return TargetOutcome.DONE, "remains removed, agent failed, " + (
        "reservation released" if released else "it held no reservation"
    )


class LostAgents(Kind):
    name = OperationKind.LOST_AGENTS
    volatile = frozenset({"heartbeat_age_seconds", "silent_seconds", "age_seconds", "sandbox", "sandbox_detail", "why"})
    params = ("evidence",)
    swept = True
    #: Default seconds between two lost-agent sweeps of one scope (``KICI_SWEEP_LOST_AGENTS_SECONDS``):
    #: short, because a lost agent holds a slot other jobs wait for.
    sweep_seconds = 30

    def validate_scope(self, scope: Scope) -> None:
        """ScopeInvalid naming ``evidence`` unless it is absent, ``sandbox-gone`` or ``heartbeat``."""
        evidence = scope.params.get("evidence")
        if evidence is not None and evidence not in EVIDENCE:
            raise ScopeInvalid("evidence", f"{evidence!r} is not one of {', '.join(EVIDENCE)}")

    def sweep_scopes(self) -> list[Scope]:
        """Per scaler with a running or draining agent: one scope per kind of evidence."""
        scaler_ids = set(Agent.objects.filter(state__in=WATCHED_STATES).values_list("scaler_id", flat=True))
        return [
            Scope(scaler=s, params={"evidence": e})
            for s in Scaler.objects.filter(pk__in=scaler_ids).order_by("name")
            for e in EVIDENCE
        ]

    def planned_by_host(self, scope: Scope) -> bool:
        """``sandbox-gone`` needs the probe of the agent's own host; ``heartbeat`` is the database's
        word, planned by the leading sweeper for every host (another host's sandboxes are ``not
        probed`` there, so the agents of a host that went down entirely are still seen)."""
        return scope.params.get("evidence") != "heartbeat"

    def auto_approves(self, scope: Scope) -> bool:
        """Whether a swept operation of ``scope`` is approved without a person (module doc): only
        ``sandbox-gone`` ones, unless ``KICI_LOST_AGENTS_AUTO_RELEASE`` is off."""
        return scope.params.get("evidence") == "sandbox-gone" and bool(
            getattr(settings, "KICI_LOST_AGENTS_AUTO_RELEASE", True)
        )

    def plan(self, scope: Scope) -> Plan:
        """Every running/draining agent of the scope, probed (one runtime listing per scaler): lost ones
        are targets (``agent:<id>``, evidence as in the module doc), live ones and lost ones of the other
        ``evidence`` are spared with the reason. ``context``: ``rows`` (agent id → (pk, state, last
        heartbeat datetime) for the run's compare-and-swap) and ``lost`` (agent id → evidence, all
        evidence kinds, for :meth:`observe`)."""
        now = timezone.now()
        timeout = heartbeat_timeout_seconds()
        since = console_boot_time()
        wanted = scope.params.get("evidence")
        qs = Agent.objects.select_related("scaler").filter(state__in=WATCHED_STATES).order_by("created_at", "id")
        if scope.scaler is not None:
            qs = qs.filter(scaler=scope.scaler)
        rows = list(qs)
        by_scaler: dict[int, list] = {}
        for agent in rows:
            by_scaler.setdefault(agent.scaler_id, []).append(agent)
        probes = {}
        for agents in by_scaler.values():
            probes.update(probe_sandboxes(agents[0].scaler, agents))

        reserved = set(Reservation.objects.filter(agent__in=rows).values_list("agent_id", flat=True))
        result = Plan(context={"rows": {}, "lost": {}})
        result.notes.append(
            f"an agent is lost when its sandbox is provably gone or it sent no heartbeat for {timeout}s "
            "(KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS)"
            + (f", counted from the console's boot at {since:%Y-%m-%d %H:%M:%S %Z} at the earliest" if since else "")
        )
        for agent in rows:
            probe = probes.get(agent.agent_id)
            heard = agent.last_heartbeat or agent.registered_at or agent.created_at
            verdict = assess(
                agent.state,
                heard,
                probe.state if probe else "not probed",
                now=now,
                timeout_seconds=timeout,
                since=since,
                sandbox_detail=probe.detail if probe else "",
                what=probe.what if probe else "sandbox",
            )
            evidence = {
                "state": agent.state,
                "registered": is_registered(agent),
                "scaler": agent.scaler.name,
                "lost_by": verdict.lost_by,
                "last_heartbeat": heartbeat_key(agent.last_heartbeat),
                "heartbeat_age_seconds": verdict.heartbeat_age_seconds,
                "silent_seconds": verdict.silent_seconds,
                "heartbeat_timeout_seconds": timeout,
                "sandbox": verdict.sandbox,
                "sandbox_gone": verdict.sandbox_gone,
                "sandbox_detail": verdict.sandbox_detail,
                "managed_id": agent.managed_id or None,
                "reservation": agent.pk in reserved,
                "bound_job": agent.bound_job_id or None,
                "owner_instance": agent.owner_instance or None,
                "age_seconds": age_seconds(agent.created_at, now),
                "why": "; ".join(verdict.reasons),
            }
            key = f"agent:{agent.agent_id}"
            if verdict.lost_by is None:
                heard_text = (
                    "never" if verdict.heartbeat_age_seconds is None else f"{verdict.heartbeat_age_seconds}s ago"
                )
                result.spared.append(
                    Spared(
                        key,
                        agent.agent_id,
                        f"alive: last heartbeat {heard_text}, {verdict.sandbox} {probe.what if probe else 'sandbox'}",
                        evidence,
                    )
                )
                continue
            result.context["lost"][agent.agent_id] = evidence
            result.context["rows"][agent.agent_id] = (agent.pk, agent.state, agent.last_heartbeat)
            if wanted is not None and _CLASS[verdict.lost_by] != wanted:
                other = (
                    "its sandbox is provably gone"
                    if verdict.lost_by == "sandbox"
                    else "only its heartbeat is missing (its sandbox is not proven gone)"
                )
                result.spared.append(
                    Spared(
                        key,
                        agent.agent_id,
                        f"lost, but {other}: planned under evidence={_CLASS[verdict.lost_by]}",
                        evidence,
                    )
                )
                continue
            result.targets.append(Target(key, ACTION, agent.agent_id, evidence))
        return result

    def act(self, run, scope, plan, targets) -> None:
        """Release each re-checked target through :func:`teardown_lost_agent` (which
        skips an agent whose state or last heartbeat moved since the re-plan) and report the outcome."""
        rows = plan.context["rows"]
        for target in targets:
            pk, state, last_heartbeat = rows[target.subject]
            why = target.evidence.get("why") or target.evidence.get("lost_by")
            try:
                outcome, detail = teardown_lost_agent(
                    pk,
                    state,
                    last_heartbeat,
                    reason=f"lost agent released by operation #{run.operation_id}",
                    failure_reason=f"lost ({why}); released by operation #{run.operation_id}",
                    hold=target.evidence.get("lost_by") == "heartbeat",
                )
            except Exception as exc:  # noqa: BLE001 - one agent failing does not stop the others
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            run.report(target.key, outcome, detail)

    def observe(self, scope: Scope, plan: Plan, operation=None) -> int:
        """Mark the lost agents this sweep found on their rows and clear stale marks (module doc).

        Called by the periodic sweep after it planned ``scope`` (``operation``: the operation it stored
        or reused for this plan's targets, else None). Marks only this plan's targets (the other
        evidence scope marks its own); clears the mark of every watched agent of the scope found not
        lost. Records ``agent.lost`` when a mark is new or its evidence (heartbeat, lost_by) changed.
        Returns how many agents were newly marked.
        """
        from django.db import transaction

        now = timezone.now()
        lost = plan.context["lost"] if plan.context else {}
        stale = Agent.objects.filter(state__in=WATCHED_STATES).exclude(lost={}).exclude(agent_id__in=list(lost))
        if scope.scaler is not None:
            stale = stale.filter(scaler=scope.scaler)
        stale.update(lost={})
        new = 0
        for target in plan.targets:
            ev = target.evidence
            mark = {
                "at": now.isoformat(),
                "heartbeat_at": ev["last_heartbeat"],
                "lost_by": ev["lost_by"],
                "sandbox": ev["sandbox"],
                "reasons": [r for r in (ev.get("why") or "").split("; ") if r],
                "operation": operation.pk if operation is not None else None,
            }
            with transaction.atomic():
                agent = (
                    Agent.objects.select_for_update()
                    .select_related("scaler")
                    .filter(agent_id=target.subject, state__in=WATCHED_STATES)
                    .first()
                )
                if agent is None or heartbeat_key(agent.last_heartbeat) != ev["last_heartbeat"]:
                    continue  # it moved on since the plan: nothing to mark
                before = agent.lost or {}
                if before.get("heartbeat_at") == mark["heartbeat_at"] and before.get("lost_by") == mark["lost_by"]:
                    if before.get("operation") != mark["operation"] or before.get("sandbox") != mark["sandbox"]:
                        Agent.objects.filter(pk=agent.pk).update(lost={**mark, "at": before.get("at", mark["at"])})
                    continue
                Agent.objects.filter(pk=agent.pk).update(lost=mark)
                where = f"; release: operation #{mark['operation']}" if mark["operation"] else ""
                record_event(
                    agent,
                    EventType.LOST,
                    f"lost: {ev.get('why') or ev['lost_by']}{where}",
                    payload={k: v for k, v in mark.items() if k != "at"},
                )
                new += 1
        return new
