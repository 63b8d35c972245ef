"""``/agents/<agent_id>/``: one agent's state, labels, host access and timeline."""

from __future__ import annotations

from django.db.models import Q
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents.models import Agent, ScalerEvent
from kici_site.errors import error_page
from lib.query import check_parameters, choice

from .common import agent_or_404, can_run_selftest, viewer_required
from .console import console_streams


def host_access_view(agent: Agent) -> dict:
    """What the agent page says about host access.

    ``entries``: the resolved list stored at spawn (None when not resolved yet); ``explicit``: the
    label set's explicit list was used (else the default list); ``label_set_entries`` /
    ``label_set_explicit``: what the label set says now; ``drift``: the two differ, so a host-access
    change is waiting to be applied to this agent.
    """
    ls = agent.label_set
    ls_entries = ls.host_access if ls is not None else None
    drift = False
    if ls is not None and agent.host_access is not None:
        if ls_entries is not None:
            drift = (not agent.host_access_explicit) or list(ls_entries) != list(agent.host_access)
        else:
            drift = agent.host_access_explicit
    return {
        "entries": agent.host_access,
        "explicit": agent.host_access_explicit,
        "label_set_entries": ls_entries,
        "label_set_explicit": ls_entries is not None,
        "drift": drift,
    }


@require_GET
@viewer_required
def agent_detail(request, agent_id: str):
    """``/agents/<agent_id>/``: state, labels, timestamps, host access, rules in force, timeline;
    ``?part=events`` only the timeline's rows. 400 naming any other parameter or part."""
    agent = agent_or_404(agent_id)
    try:
        check_parameters(request.GET, single=("part",))
        part = choice("part", request.GET.get("part"), ("events",))
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    events = ScalerEvent.objects.filter(Q(agent=agent) | Q(agent_ref=agent.agent_id)).order_by("-created_at", "-id")[
        :500
    ]
    if part == "events":
        return render(
            request,
            "dashboard/index.html#event_tbody",
            {"events": events, "max_rows": 500, "resync_url": request.get_full_path()},
        )
    ctx = {
        "nav": "agents",
        "agent": agent,
        "agents": [agent],
        "events": events,
        "max_rows": 500,
        "host_access": host_access_view(agent),
        "can_selftest": can_run_selftest(request.user),
        "streams": console_streams(agent),
        "event_resync_url": f"{reverse('agent_detail', args=[agent.agent_id])}?part=events",
    }
    return render(request, "agents/detail.html", ctx)
