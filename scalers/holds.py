"""Debug holds: the sandbox of an agent that ended kept for a bounded time, so a person can look
inside it, then reaped by the sweeper (Zuul's autohold). :func:`take_hold` is called by
``scalers.lifecycle`` where a teardown would begin; where holds come from, what a held agent keeps
and which ends never hold: docs/configuration.md ("Debug holds").
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from agents.choices import LIVE_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import Agent
from lib.units import format_duration
from lib.wording import json_text
from scalers.choices import LOCAL_SCALER_TYPES
from scalers.config.schema import DEFAULT_HOLD_SECONDS, MAX_HOLD_SECONDS, MIN_HOLD_SECONDS

#: States from which an end may become a hold: the sandbox exists and no backend call is in flight.
HOLDABLE_STATES = (AgentState.CONNECTING, AgentState.RUNNING, AgentState.DRAINING, AgentState.DESTROYING)
#: States in which an operator may arm a hold: the agent has not ended yet.
ARMABLE_STATES = LIVE_STATES

SOURCE_OPERATOR = "operator"
SOURCE_LABEL_SET = "label-set"

#: Longest hold reason (characters).
MAX_REASON = 500


def seconds_problem(value) -> str | None:
    """What is wrong with a hold duration (a whole number of seconds from :data:`MIN_HOLD_SECONDS`
    to :data:`MAX_HOLD_SECONDS`), naming the value; None when it is fine."""
    if isinstance(value, int) and not isinstance(value, bool) and MIN_HOLD_SECONDS <= value <= MAX_HOLD_SECONDS:
        return None
    return (
        f"must be a whole number of seconds from {MIN_HOLD_SECONDS} to {MAX_HOLD_SECONDS} "
        f"({format_duration(MAX_HOLD_SECONDS)}), got {json_text(value)}"
    )


def reason_problem(value) -> str | None:
    """What is wrong with a hold reason (a non-empty text of at most :data:`MAX_REASON` characters)."""
    if isinstance(value, str) and value.strip() and len(value.strip()) <= MAX_REASON:
        return None
    return f"must be a non-empty text of at most {MAX_REASON} characters saying why, got {json_text(value)}"


def is_armed(agent: Agent) -> bool:
    """An operator's hold waits for the agent's end (armed, not taken yet)."""
    return bool(agent.hold) and not agent.hold.get("since")


def arm_hold(agent_id: str, *, reason: str, seconds: int, requested_by: str, approved_by: str, operation: int) -> bool:
    """Arm an operator's hold on live agent ``agent_id`` (compare-and-swap: still live, no hold yet).
    Records ``agent.hold_armed``. Returns False when the agent ended or already has a hold. Raises
    ValueError naming the field for a bad ``reason`` or ``seconds``."""
    if problem := reason_problem(reason):
        raise ValueError(f"reason: {problem}")
    if problem := seconds_problem(seconds):
        raise ValueError(f"seconds: {problem}")
    hold = {
        "source": SOURCE_OPERATOR,
        "by": requested_by,
        "approvedBy": approved_by,
        "reason": reason.strip(),
        "seconds": seconds,
        "operation": operation,
        "armedAt": timezone.now().isoformat(),
    }
    won = Agent.objects.filter(agent_id=agent_id, state__in=ARMABLE_STATES, hold={}).update(
        hold=hold, updated_at=timezone.now()
    )
    if won:
        agent = Agent.objects.select_related("scaler").get(agent_id=agent_id)
        record_event(
            agent,
            EventType.HOLD_ARMED,
            f"hold armed by {requested_by} for {format_duration(seconds)}: its sandbox is kept when it ends",
            payload=hold,
        )
    return bool(won)


def hold_to_take(agent: Agent, *, failed: bool) -> dict | None:
    """The hold that keeps ``agent``'s sandbox if it ends now (``failed``: it ends ``failed``, or its
    job failed): its armed operator hold, else its label set's ``debugHold.onFailure`` when it
    failed; None when it is not held (no hold, not holdable, no sandbox of a local scaler type,
    already held once)."""
    if agent.state not in HOLDABLE_STATES or not agent.managed_id or agent.scaler.type not in LOCAL_SCALER_TYPES:
        return None
    if is_armed(agent):
        return dict(agent.hold)
    if agent.hold:  # held and released once: never again
        return None
    label_set = agent.label_set
    if label_set is None:
        return None
    config = label_set.debug_hold
    if failed and config.get("onFailure") is True:
        return {
            "source": SOURCE_LABEL_SET,
            "by": "scalers.yaml",
            "approvedBy": "",
            "reason": f"debugHold.onFailure of label set {label_set.normalized}",
            "seconds": int(config.get("durationSeconds") or DEFAULT_HOLD_SECONDS),
            "operation": None,
        }
    return None


def take_hold(agent: Agent, hold: dict, *, end_state: str, reason: str, failure_reason: str = "") -> bool:
    """Hold ``agent`` instead of ending it (compare-and-swap from :data:`HOLDABLE_STATES`): state
    ``held``, ``held_until`` now + ``hold["seconds"]``, the end it was spared (``end_state``,
    ``reason``, ``failure_reason``) kept for its teardown; records ``agent.held``. Nothing is
    destroyed or released. Returns False when the agent moved meanwhile."""
    now = timezone.now()
    until = now + timedelta(seconds=int(hold["seconds"]))
    taken = hold | {"since": now.isoformat(), "until": until.isoformat(), "end": str(end_state), "endReason": reason}
    fields: dict[str, object] = {
        "state": AgentState.HELD,
        "held_until": until,
        "hold": taken,
        "teardown_reason": reason[:200],
        "updated_at": now,
    }
    if failure_reason:
        fields["failure_reason"] = failure_reason[:4000]
    won = Agent.objects.filter(pk=agent.pk, state__in=HOLDABLE_STATES).update(**fields)
    if not won:
        return False
    agent.state, agent.held_until, agent.hold = AgentState.HELD, until, taken
    record_event(agent, EventType.HELD, hold_wording(agent), payload=taken)
    return True


def hold_wording(agent: Agent) -> str:
    """One sentence: who holds (or armed a hold on) the agent, why, and until when / for how long."""
    hold = agent.hold or {}
    if not hold:
        return ""
    who = hold.get("by", "")
    if hold.get("approvedBy"):
        who += f", approved by {hold['approvedBy']}"
    op = f" (operation #{hold['operation']})" if hold.get("operation") else ""
    if not hold.get("since"):
        return (
            f"hold armed by {who}{op}: its sandbox is kept {format_duration(hold.get('seconds'))} "
            f"when it ends: {hold.get('reason', '')}"
        )
    until = str(hold.get("until", ""))[:19].replace("T", " ")
    ended = f", kept from its teardown after {hold['endReason']}" if hold.get("endReason") else ""
    return f"held by {who}{op} until {until} UTC{ended}: {hold.get('reason', '')}"
