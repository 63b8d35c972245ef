"""A failed spawn: the ``scaler.failed`` detail (the error plus the agent's last output lines)
and the agent's final state once the failure path removed what the spawn created."""

from __future__ import annotations

from datetime import datetime

from agents.models import Agent

#: Lines of agent output (a container's logs, a process's log file) attached to a ``scaler.failed``
#: detail.
CAPTURED_LINES = 50
#: Lines of a real KiCI agent's own log the follow reads at each look (``agent_log_lines``).
AGENT_LOG_LINES = 200


def failure_detail(error: BaseException, captured: list[str]) -> str:
    """``scaler.failed`` detail: the message, plus ``\\n--- captured output ---\\n<lines>`` when any."""
    detail = str(error) or type(error).__name__
    if captured:
        detail += "\n--- captured output ---\n" + "\n".join(captured[-CAPTURED_LINES:])
    return detail


#: The states a spawn failure ends (becomes ``failed``). The failure path removed the sandbox, so an
#: agent that registered meanwhile (``running``) or was drained since (``draining``) has nothing left
#: to run on: leaving it active would hold its slot for nothing, even when the spawn fails after the
#: agent registered. ``destroying`` is left to the teardown in progress, which ends it
#: ``destroyed`` and releases; terminal states stay as they are.
SPAWN_FAILURE_ENDS = ("spawning", "connecting", "running", "draining")


def mark_spawn_failed(agent_pk: int, detail: str, now: datetime | None = None) -> bool:
    """Compare-and-swap the agent row ``agent_pk`` from any of :data:`SPAWN_FAILURE_ENDS` to
    ``failed`` with ``failure_reason`` = ``detail`` (first 4000 characters) and ``finished_at``.

    Call it only once the failure path removed the sandbox (container, VM, process). Returns True
    when this call moved the row. The caller records ``scaler.failed`` and releases the reservation.
    """
    from django.utils import timezone

    return bool(
        Agent.objects.filter(pk=agent_pk, state__in=SPAWN_FAILURE_ENDS).update(
            state="failed",
            failure_reason=detail[:4000],
            finished_at=now or timezone.now(),
            updated_at=now or timezone.now(),
        )
    )
