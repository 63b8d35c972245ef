"""``/``: the dashboard (capacity, live agents, recent events, the last recovery).

Its cost does not grow with the fleet: the capacity cards carry the counts (per state, per scaler),
the agents table only the newest :data:`DASHBOARD_AGENT_LIMIT` live agents, with a link to
``/agents/`` for the rest.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents.choices import ACTIVE_STATES
from agents.listing import filter_agents
from agents.models import Agent, ScalerEvent
from lib.errors import error_page
from lib.query import check_parameters, choice
from scalers.capacity import global_capacity, pool_capacities, scaler_capacities
from scalers.models import RecoveryReport, Scaler

from .common import viewer_required

#: Live agents the dashboard lists (newest first); the agent list pages through the others.
DASHBOARD_AGENT_LIMIT = 25
DASHBOARD_EVENT_LIMIT = 30


RECOVERY_COUNTS = (
    ("spawning_dropped", "spawns given up"),
    ("reservations_dropped", "reservations dropped"),
    ("buffered_events_lost", "buffered events lost"),
    ("spawning_agents_rehydrated", "spawns still running"),
    ("reservations_rehydrated", "reservations kept"),
    ("agent_jobs_rehydrated", "agents on a job"),
)


def recovery_report() -> dict | None:
    """The latest recovery run's counts (``scalers.models.RecoveryReport``, written at every boot
    and leader change), or None when there is none.

    Returns ``{"at", "trigger", "instance", "counts": [(label, n)], "nonzero": [(label, n)],
    "dropped": int, "error", "eventful": bool}``; ``dropped`` sums what recovery threw away (shown as a warning when not
    zero); ``eventful`` is False when it dropped and rehydrated nothing and failed in nothing (the
    dashboard then shows one quiet line instead of a banner of zeros).
    """
    report = RecoveryReport.objects.first()
    if report is None:
        return None
    counts = [(label, getattr(report, name, 0)) for name, label in RECOVERY_COUNTS]
    dropped = report.spawning_dropped + report.reservations_dropped + report.buffered_events_lost
    return {
        "at": report.created_at,
        "trigger": report.trigger,
        "instance": report.instance_id,
        "counts": counts,
        "dropped": dropped,
        "error": report.error,
        "nonzero": [(label, n) for label, n in counts if n],
        "eventful": bool(report.error) or any(n for _, n in counts),
    }


#: A scaler's active agents; a retiring scaler gets a card while it has one (an EXISTS probe on
#: the (scaler, state) index, not a join over every agent).
_active_agents = Agent.objects.filter(scaler=OuterRef("pk"), state__in=ACTIVE_STATES)


@require_GET
@viewer_required
def dashboard(request):
    """``/``: capacity per scaler (and pools, and the console), live agents, recent events;
    ``?part=agents`` / ``?part=events`` only those rows. 400 naming any other parameter or part."""
    try:
        check_parameters(request.GET, single=("part",))
        part = choice("part", request.GET.get("part"), ("agents", "events"))
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    agents = list(filter_agents({"state": "active"})[0][:DASHBOARD_AGENT_LIMIT])  # its row view's query
    events = ScalerEvent.objects.all()[:DASHBOARD_EVENT_LIMIT]
    url = reverse("dashboard")
    ctx = {
        "agent_limit": DASHBOARD_AGENT_LIMIT,
        "nav": "dashboard",
        "agents": agents,
        "events": events,
        "max_rows": DASHBOARD_EVENT_LIMIT,
        "empty_text": "No live agents.",
    }
    if part == "agents":
        return render(request, "dashboard/index.html#agent_tbody", {**ctx, "resync_url": f"{url}?part=agents"})
    if part == "events":
        return render(request, "dashboard/index.html#event_tbody", {**ctx, "resync_url": f"{url}?part=events"})
    ctx.update(
        global_cap=global_capacity(),
        pool_caps=pool_capacities(),
        scaler_caps=scaler_capacities(Scaler.objects.filter(Q(retiring=False) | Exists(_active_agents)), pauses=True),
        recovery=recovery_report(),
        agent_resync_url=f"{url}?part=agents",
        event_resync_url=f"{url}?part=events",
    )
    return render(request, "dashboard/index.html", ctx)
